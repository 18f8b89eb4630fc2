"""Kernel time and host syncs of steady W7 steps under one allocator (torch.profiler)."""
import os, sys, collections
import torch
sys.path.insert(0, "benches")
import w7_training as W
alloc, model = sys.argv[1], sys.argv[2]
if alloc == "xlog":
    import xlog_cuda.torch as xt
    xt.enable(backend="cuda")
W.warm_up_cuda(torch)
plan = W.step_plan(model, 10)
plan = None if plan is None else plan * 3
_, _, step = W.build_workload(torch, model, plan)
for i in range(20):
    step(i)
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for i in range(20, 30):
        step(i)
    torch.cuda.synchronize()
ev = p.events()
kern = collections.defaultdict(lambda: [0, 0.0])
cpu = collections.defaultdict(lambda: [0, 0.0])
for e in ev:
    dt = getattr(e, "device_type", None)
    if str(dt).endswith("CUDA"):
        k = kern[e.name[:70]]; k[0] += 1; k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    elif e.name.startswith("cuda") or e.name.startswith("cu"):
        c = cpu[e.name]; c[0] += 1; c[1] += e.cpu_time_total
tot = sum(v[1] for v in kern.values())
print(f"{alloc} {model}: kernels {sum(v[0] for v in kern.values())} total GPU {tot/1e3/10:.2f} ms/step")
for n, (c, t) in sorted(kern.items(), key=lambda x: -x[1][1])[:12]:
    print(f"  {t/1e3/10:8.3f} ms/step {c//10:5d}/step  {n}")
for n, (c, t) in sorted(cpu.items(), key=lambda x: -x[1][1])[:8]:
    print(f"  host {n}: {c//10}/step {t/1e3/10:.3f} ms/step")
par = collections.Counter()
for e in ev:
    if e.name in ("cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
        chain = []
        q = e.cpu_parent
        while q is not None and len(chain) < 6:
            chain.append(q.name[:40]); q = q.cpu_parent
        par[e.name + " <- " + " <- ".join(chain)] += 1
for k, v in par.most_common(12):
    print(f"  {v:4d} {k}")

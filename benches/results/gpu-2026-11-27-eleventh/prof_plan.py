# python3 prof_plan.py MODEL PASSES: the timed plan (10 steps) run 1 + PASSES times under xlog; the
# experiment library prints its driver-call totals at exit.
import sys, os, time
sys.path.insert(0, "benches")
import w7_training as W
model, passes = sys.argv[1], int(sys.argv[2])
import xlog_cuda.torch as xt
xt.enable(backend="cuda")
import torch
torch.manual_seed(0)
timed = W.step_plan(model, 10)
plan = timed * (1 + passes) if timed else None
_, _, step = W.build_workload(torch, model, plan)
t = []
for i in range(10 * (1 + passes)):
    w, h, g = W.timed_step(torch, step, i)
    if i >= 10: t.append(h)
st = xt.stats(0)
print(f"{model} passes {passes}: host median {sorted(t)[len(t)//2] if t else 0:.2f} ms, pages mapped {st.pages_mapped} unmapped {st.pages_unmapped} misses {st.cache_misses}", flush=True)

# torch-level replay of a trace's allocations: python3 trace_torch.py ALLOC TRACE [repeats]
import sys, time, os, csv
alloc, path = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
if alloc == "xlog_pool":
    os.environ["XLOG_MEMORY"] = "pool"
import torch
if alloc.startswith("xlog"):
    import xlog_cuda.torch as xt
    xt.enable(backend="cuda")
torch.cuda.init(); torch.empty(1, device="cuda")
ops = []
with open(path) as f:
    for r in csv.DictReader(f):
        if r["Action"] == "allocate": ops.append((True, r["Pointer"], int(r["Size"])))
        elif r["Action"] == "free": ops.append((False, r["Pointer"], 0))
def run():
    live = {}
    empty, u8 = torch.empty, torch.uint8
    t = time.perf_counter()
    for a, p, s in ops:
        if a: live[p] = empty(s, dtype=u8, device="cuda")
        else: live.pop(p, None)
    dt = time.perf_counter() - t
    live.clear()
    return dt
def py():  # the same loop, no allocation: the Python cost
    live = {}
    t = time.perf_counter()
    for a, p, s in ops:
        if a: live[p] = s
        else: live.pop(p, None)
    return time.perf_counter() - t
def st():
    if not alloc.startswith("xlog"): return None
    x = xt.stats(0); return (x.pages_mapped, x.pages_unmapped, x.cache_misses, x.allocations)
run()
ts = []
for _ in range(reps):
    a = st(); ts.append(run()); b = st()
    if a: print("   delta mapped/unmapped/misses/allocs", [y - x for x, y in zip(a, b)], f"{ts[-1]*1e3:.1f} ms")
base = min(py() for _ in range(3))
n = sum(1 for o in ops if o[0])
ts.sort()
print(f"{alloc:10s} {os.path.basename(path)}: per allocation+free {1e6*(ts[len(ts)//2]-base)/n:.3f} us median, {1e6*(ts[0]-base)/n:.3f} min (python loop {1e6*base/n:.3f} us subtracted)", flush=True)

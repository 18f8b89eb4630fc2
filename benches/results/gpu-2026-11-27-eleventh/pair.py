# torch-level alloc/free pair cost: python3 pair.py ALLOC
import sys, time, statistics, os
alloc = sys.argv[1]
if alloc == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch
if alloc == "xlog":
    import xlog_cuda.torch as xt
    xt.enable()
def cpu():
    t = time.perf_counter(); x = 0
    for i in range(2_000_000): x += i * i
    return (time.perf_counter() - t) * 1e3
c0 = cpu()
torch.cuda.init()
torch.empty(1, device="cuda")
res = {}
for size in (4096, 1 << 20, 64 << 20):
    n = 20000
    for _ in range(2000):
        x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
    samples = []
    for r in range(7):
        t = time.perf_counter()
        for _ in range(n):
            x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
        samples.append((time.perf_counter() - t) / n * 1e6)
    # a mixed pattern: 64 live tensors of varied sizes, replaced round robin
    res[size] = statistics.median(samples)
sizes = [(i * 7919 % 97 + 1) * 8192 for i in range(64)]
held = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
samples = []
for r in range(7):
    t = time.perf_counter()
    for k in range(20000):
        j = k % 64
        held[j] = torch.empty(sizes[(j + k) % 64], dtype=torch.uint8, device="cuda")
    samples.append((time.perf_counter() - t) / 20000 * 1e6)
res["mixed"] = statistics.median(samples)
torch.cuda.synchronize()
print(alloc, f"cpu0 {c0:.0f}ms cpu1 {cpu():.0f}ms cpu#{os.sched_getaffinity(0).__len__()}", " ".join(f"{k}:{v:.3f}us" for k, v in res.items()))

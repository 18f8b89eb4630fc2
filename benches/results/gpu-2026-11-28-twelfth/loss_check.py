"""GPT-2 (fixed shape) losses step by step under one allocator, seeded: a page
shared by two live tensors would show as a loss that departs from the caching
allocator's."""
import sys
import torch
sys.path.insert(0, "benches")
import w7_training as W
alloc = sys.argv[1]
if alloc == "xlog":
    import xlog_cuda.torch as xt
    xt.enable(backend="cuda")
torch.manual_seed(0)
W.warm_up_cuda(torch)
torch.manual_seed(0)
_, _, step = W.build_workload(torch, sys.argv[2], None)
out = []
for i in range(int(sys.argv[3])):
    out.append(step(i).item())
print(alloc, " ".join(f"{v:.4f}" for v in out))
if alloc == "xlog":
    st = xt.stats()
    print("xlog stats:", {k: getattr(st, k, None) for k in ("pages_mapped", "pages_unmapped", "cache_misses", "peak_live_bytes")})

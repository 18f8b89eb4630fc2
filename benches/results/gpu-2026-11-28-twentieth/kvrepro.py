"""kv_serve under xlog, step by step, synchronising after each: which step
fails (and, under compute-sanitizer, where). XLOG_CUDA_LIBRARY names the library."""
import os, sys, time, traceback
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benches"))
import w7_training as w7
import xlog_cuda.torch as xt
xt.enable(backend="cuda", log_path=os.environ.get("REPRO_LOG", ""))
import torch
steps = int(os.environ.get("REPRO_STEPS", "5"))
_, plan = w7.run_plan("kv_serve", 2, steps, True)
model, opt, step = w7.build_workload(torch, "kv_serve", plan)
print("plan", plan, flush=True)
for i in range(len(plan)):
    t0 = time.perf_counter()
    try:
        step(i)
        torch.cuda.synchronize()
    except Exception as e:
        print(f"step {i} {plan[i]} FAILED after {time.perf_counter() - t0:.1f}s: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        s = xt.stats(0)
        print("stats", s.allocations, s.cache_misses, s.pages_mapped, s.pages_unmapped, flush=True)
        sys.exit(3)
    s = xt.stats(0)
    print(f"step {i} {plan[i]} ok {time.perf_counter() - t0:.2f}s allocs {s.allocations} misses {s.cache_misses} mapped {s.pages_mapped} unmapped {s.pages_unmapped}", flush=True)
print("done", flush=True)

"""In-process A/B: the same steps under the arena's normal slack (A, 1/64)
and a slack so wide nothing is lent or remapped (B, 1/2), alternated, with
a trim before each phase. argv: model steps rounds allocator(xlog|caching)"""
import os, sys, time, json, statistics
sys.path.insert(0, os.path.join(os.getcwd(), "benches"))
model_name, steps, rounds, alloc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import torch
if alloc == "xlog":
    import xlog_cuda.torch as xt
    xt.enable()
import w7_training as w7
plan = w7.step_plan(model_name, steps + 2)
model, opt, step = w7.build_workload(torch, model_name, plan)
for i in range(3):
    step(i % len(plan)) if plan else step(0)
torch.cuda.synchronize()
out = []
for rnd in range(rounds):
    for phase, slack in (("A", "64"), ("B", "2")):
        os.environ["XLOG_EXP_SLACK"] = slack
        torch.cuda.synchronize()
        if alloc == "xlog":
            xt.trim(keep_bytes=0)
            m0 = xt.stats().pages_mapped
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            loss = step(i)
            loss.item()
            times.append((time.perf_counter() - t0) * 1e3)
        m1 = xt.stats().pages_mapped if alloc == "xlog" else 0
        st = xt.stats() if alloc == "xlog" else None
        rec = dict(round=rnd, phase=phase, total_ms=round(sum(times[2:]), 1), med=round(statistics.median(times[2:]), 2),
                   maps=(m1 - m0) if alloc == "xlog" else None,
                   held=getattr(st, "outstanding_bytes", None), peak_live=getattr(st, "peak_live_bytes", None))
        print(json.dumps(rec), flush=True)
        out.append(rec)
for ph in "AB":
    print(ph, "total of rounds:", [r["total_ms"] for r in out if r["phase"] == ph])

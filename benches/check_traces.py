#!/usr/bin/env python3
"""Replay every trace in benches/traces (*.csv.gz: xlog or RMM logs) on
sim with the footprint bound: the ctest `replay_footprint`.

    python3 benches/check_traces.py [--max-held-ratio 1.10] [--gpu-lags 0,200] [DIR]

Runs `python -m xlog_cuda.replay TRACE --max-held-ratio R --gpu-lag N
--check-access` for each trace and each lag (xlog's default memory, the
arena) and exits 1 if any run did not exit 0: the footprint bound, and
every block's use checked in stream order (mapped with access, its
physical bytes no other block's meanwhile), as the GPU would fault. Lag 0
lets the sim's streams run at once; lag 200 keeps them 200-400 operations
behind, as a GPU runs behind its program, so the latest frees are still
running when the next allocations come (what
made the arena hold 1.08x the live peak on the GPU while a lag-free replay
of the same trace held 1.02x). A trace dropped into the directory (a log
recorded on a GPU, compressed) is checked with the others.

The traces: train_varlen (benches/make_trace.py, synthetic), and logs
recorded on an H100 by `benches/w7_training.py --trace-dir` (GPT-2 fixed
and with changing lengths, a BERT masked LM with random lengths, ResNet-50,
the first 40,000 rows of GPT-2 generation with a growing KV cache; on an
H200, generation with a Llama-style decoder, `llama_gen`, Faster R-CNN
training on new image sizes, `det_dyn`, and BERT inference requests of new
shapes, `bert_serve`) and by
`benches/w11_run.sh` with XLOG_LOG_PATH (the four-stream relational
engine).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", default=os.path.join(here, "traces"))
    ap.add_argument("--max-held-ratio", default="1.10")
    ap.add_argument("--gpu-lags", default="0,200", help="comma-separated --gpu-lag values (default 0,200)")
    args = ap.parse_args()
    traces = sorted(glob.glob(os.path.join(args.directory, "*.csv.gz")))
    if not traces:
        print(f"no *.csv.gz trace in {args.directory}", file=sys.stderr)
        return 1
    lags = [lag.strip() for lag in args.gpu_lags.split(",") if lag.strip()]
    failed = []
    for trace in traces:
        for lag in lags:
            cmd = [sys.executable, "-m", "xlog_cuda.replay", trace, "--max-held-ratio", args.max_held_ratio,
                   "--gpu-lag", lag, "--check-access", "-q"]
            print("$ " + " ".join(cmd[1:]), flush=True)
            rc = subprocess.call(cmd)
            if rc != 0:
                failed.append(f"{os.path.basename(trace)} at lag {lag} (exit {rc})")
    runs = len(traces) * len(lags)
    if failed:
        print(f"replay_footprint: {len(failed)} of {runs} replay(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"replay_footprint: {len(traces)} trace(s) x lags {','.join(lags)} within held/live <= {args.max_held_ratio}, every access check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Replay every trace in benches/traces (*.csv.gz: xlog or RMM logs) on
sim with the footprint bound: the ctest `replay_footprint`.

    python3 benches/check_traces.py [--max-held-ratio 1.10] [DIR]

Runs `python -m xlog_cuda.replay TRACE --max-held-ratio R` for each trace
(xlog's default memory, the arena) and exits 1 if any run did not exit 0.
A trace dropped into the directory (a log recorded on a GPU, compressed)
is checked with the others.
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
    args = ap.parse_args()
    traces = sorted(glob.glob(os.path.join(args.directory, "*.csv.gz")))
    if not traces:
        print(f"no *.csv.gz trace in {args.directory}", file=sys.stderr)
        return 1
    failed = []
    for trace in traces:
        cmd = [sys.executable, "-m", "xlog_cuda.replay", trace, "--max-held-ratio", args.max_held_ratio]
        print("$ " + " ".join(cmd[1:]), flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            failed.append(f"{os.path.basename(trace)} (exit {rc})")
    if failed:
        print(f"replay_footprint: {len(failed)} of {len(traces)} trace(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"replay_footprint: {len(traces)} trace(s) within held/live <= {args.max_held_ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write a synthetic allocation trace of training with a new sequence
length every step, in xlog's CSV log format, gzip-compressed: the trace CI
replays (python -m xlog_cuda.replay, ctest replay_footprint).

    python3 benches/make_trace.py [-o benches/traces/train_varlen.csv.gz]
                                  [--steps 200] [--seed 7]

The shape is that of a small GPT-2-like model (12 layers, hidden 768, 12
heads, vocabulary 50257, batch 2, fp16 activations), which is what made
xlog's cache hold twice the live peak on a GPU (issue 24):

- long-lived blocks allocated once: embeddings, weights, gradients and
  two optimizer moments (on stream 1, never freed);
- every step a sequence length L drawn uniformly from [64, 1024]; the
  input ids (B x L int64) arrive on stream 2, a loader stream; the forward
  pass allocates per layer the qkv projection (B x L x 3H), the attention
  scores (B x heads x L x L) and the MLP hidden state (B x L x 4H), then
  the logits (B x L x V), each with a short-lived workspace freed at once;
  the backward pass frees the layers in reverse, with a gradient
  temporary per layer; everything of the step is freed by its end.

About 50 allocations a step. Sizes are rounded up to 512 bytes, as xlog's
log records them. Pointers come from a model of an address space (a bump
allocator per step, reset at the step's end, so addresses are reused
across steps as on a device). The output is the same bytes for the same
arguments (fixed seed, synthetic clock, no gzip timestamp).
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import random

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail"

BATCH, HIDDEN, HEADS, LAYERS, VOCAB = 2, 768, 12, 12, 50257
FP16, INT64 = 2, 8
PROCESS = 4242


def round_up(n: int, to: int = 512) -> int:
    return -(-n // to) * to


class Writer:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.lines = [HEADER]
        self.clock_us = 10 * 3600 * 1_000_000  # 10:00:00
        self.live = {}

    def _time(self) -> str:
        self.clock_us += self.rng.randint(2, 40)
        s, us = divmod(self.clock_us, 1_000_000)
        return f"{s // 3600 % 24:02}:{s // 60 % 60:02}:{s % 60:02}.{us:06}"

    def row(self, action: str, ptr: int, size: int, stream: int, tag: str) -> None:
        self.lines.append(f"1,{self._time()},{action},{ptr:#x},{size},{stream},{tag},0,{PROCESS},")

    def allocate(self, ptr: int, size: int, stream: int, tag: str) -> int:
        self.live[ptr] = (size, stream, tag)
        self.row("allocate", ptr, size, stream, tag)
        return ptr

    def free(self, ptr: int) -> None:
        size, stream, tag = self.live.pop(ptr)
        self.row("free", ptr, size, stream, tag)


class Bump:
    """Addresses for the blocks of one step: handed out upwards, all back at
    the end of the step."""

    def __init__(self, base: int):
        self.base = self.top = base

    def take(self, size: int) -> int:
        ptr = self.top
        self.top += round_up(size, 1 << 12)
        return ptr

    def reset(self) -> None:
        self.top = self.base


def make(steps: int, seed: int) -> str:
    rng = random.Random(seed)
    w = Writer(rng)
    persistent = Bump(0x7F0000000000)
    for tag, size in (("embedding", VOCAB * HIDDEN * FP16), ("weights", 85_000_000 * FP16),
                      ("grads", 124_000_000 * FP16), ("adam_m", 124_000_000 * FP16),
                      ("adam_v", 124_000_000 * FP16)):
        size = round_up(size)
        w.allocate(persistent.take(size), size, 1, tag)
    step_space = Bump(0x7F4000000000)
    for _ in range(steps):
        length = rng.randint(64, 1024)
        ids_size = round_up(BATCH * length * INT64)
        ids = w.allocate(step_space.take(ids_size), ids_size, 2, "input_ids")
        layers = []
        for _layer in range(LAYERS):
            blocks = []
            for tag, size in (("qkv", BATCH * length * 3 * HIDDEN * FP16),
                              ("attn_scores", BATCH * HEADS * length * length * FP16),
                              ("mlp_hidden", BATCH * length * 4 * HIDDEN * FP16)):
                size = round_up(size)
                blocks.append(w.allocate(step_space.take(size), size, 1, tag))
            # A GEMM workspace, freed as soon as the kernel is queued.
            ws = round_up(rng.choice((1, 2, 4)) << 20)
            w.free(w.allocate(step_space.take(ws), ws, 1, "workspace"))
            layers.append(blocks)
        logits_size = round_up(BATCH * length * VOCAB * FP16)
        logits = w.allocate(step_space.take(logits_size), logits_size, 1, "logits")
        w.free(ids)
        for blocks in reversed(layers):
            grad_size = round_up(BATCH * length * 4 * HIDDEN * FP16)
            grad = w.allocate(step_space.take(grad_size), grad_size, 1, "grad_tmp")
            for ptr in reversed(blocks):
                w.free(ptr)
            w.free(grad)
        w.free(logits)
        step_space.reset()
    return "\n".join(w.lines) + "\n"


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=os.path.join(here, "traces", "train_varlen.csv.gz"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    text = make(args.steps, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    buf = io.BytesIO()
    # mtime=0 and no file name in the header: the same bytes every run.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode())
    with open(args.output, "wb") as f:
        f.write(buf.getvalue())
    print(f"{args.output}: {text.count(chr(10)) - 1:,} rows, {len(buf.getvalue()):,} bytes")


if __name__ == "__main__":
    main()

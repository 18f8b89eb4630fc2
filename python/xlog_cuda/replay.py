"""Replay an allocation log through xlog on the sim backend and report
what xlog held against what the trace had live.

    python -m xlog_cuda.replay LOG [--memory arena|pool] [--budget SIZE]
                               [--device N] [--scale K|auto] [--json FILE]
                               [--max-held-ratio R]

LOG is xlog's CSV log (`Thread,Time,Action,Pointer,Size,Stream,Tag,Device,
Process,Detail`, what XLOG_LOG_PATH writes) or the CSV of RMM's
logging_resource_adaptor (`Thread,Time,Action,Pointer,Size,Stream`), plain
or gzip-compressed (recognised by its magic bytes, so `.csv.gz` or not).
Columns are found by name. The idea is that of RMM's replay benchmark:
the log's allocations and frees are done again, in the log's order, on an
allocator of our choosing, here a sim runtime (Config(backend="sim"),
nothing of the XLOG_* environment applies).

- Only `allocate` and `free` rows (RMM's `deallocate` too) drive the
  replay. Every other row (xlog's `reserve`, `release`, `retire`, `leak`,
  `allocate failure`, unknown actions, a header repeated by a second writer
  of a shared log) is counted and skipped. A row that cannot be read
  (too few columns, a size or pointer that is not a number) is counted as
  bad and skipped, never fatal; a free of a pointer the trace never
  allocated is counted and skipped; an allocation of a pointer still live
  counts as the free the log missed, then the allocation. Null pointers
  (zero-byte allocations, free(nullptr)) are counted and skipped.
- One device: `--device N`, by default the first device an allocate/free
  row names (RMM's logs have no Device column: device 0). Pointers and
  streams are told apart by Process where the log has one.
- Each stream of the trace (its stream 0, the default stream, included)
  becomes one xlog stream; the replay is single-threaded.
- Sizes are the log's. `--scale K` divides every size (and the budget) by
  K, rounding up, for traces whose peak a sim device on this host cannot
  hold: the sim reserves its whole capacity in host address space at
  open, and a capacity above the host's memory is refused. The default,
  `auto`, is 1 unless the capacity needed does not fit, then the smallest
  power of two that does; the report says which. A scaled replay keeps
  xlog's 512-byte block rounding and 2 MiB pages unscaled, so small blocks
  and small traces look a little worse than they are.
- The sim capacity is 2x the trace's live peak plus 64 MiB a stream,
  rounded up to a GiB (at least 1 GiB, at least the budget), unless
  `--capacity` says otherwise.

Reported: the trace's live peak (the sum of the sizes live at once), and
xlog's stats after the replay: peak held (`peak_outstanding_bytes`, what
the budget charges), peak live, refusals, cache hits and misses; as a
table, and with `--json FILE` as JSON. `--max-held-ratio R` is the
footprint bound: exit status 1 when xlog's peak held / the trace's live
peak exceeds R. Exit status 2: bad arguments, a file that cannot be read
or is not such a log, or a runtime that cannot be opened.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import io
import json
import math
import os
import sys
import threading
import time
import zlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

__all__ = ["Trace", "ReplayError", "CapacityRefusedError", "read_trace", "replay", "run", "format_report", "main"]

EXIT_OK = 0
EXIT_BOUND = 1
EXIT_USAGE = 2

_U64_MAX = (1 << 64) - 1
GIB = 1 << 30
MIB = 1 << 20
#: Address space a sim arena region takes per stream (sim_vm.rs); part of
#: the capacity estimate only.
_STREAM_ALLOWANCE = 64 * MIB
#: Bad rows kept (line, reason) for the report.
_BAD_EXAMPLES = 5
#: Lines a quoted field may run over.
_MAX_QUOTED_LINES = 8
#: Distinct names of ignored actions counted one by one; the rest share "(other)".
_MAX_ACTION_NAMES = 32

_ALLOC = "allocate"
_FREES = ("free", "deallocate")


class ReplayError(Exception):
    """The log cannot be replayed: unreadable, not a memory log, no rows for
    the device asked for, or a runtime that cannot be opened (exit 2)."""


class CapacityRefusedError(ReplayError):
    """The host cannot reserve the sim capacity asked for."""


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def _open_text(path: str) -> io.TextIOBase:
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise ReplayError(f"cannot open {path}: {e.strerror or e}") from None
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as e:
        raw.close()
        raise ReplayError(f"cannot read {path}: {e.strerror or e}") from None
    stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw
    # Undecodable bytes become U+FFFD: a row with them is bad, not fatal.
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")


def _pointer(text: str) -> int:
    t = text.strip()
    if t == "(nil)":
        return 0
    value = int(t, 16)  # "0x" prefix or not, as RMM's parser (std::stoull base 16)
    if not 0 <= value <= _U64_MAX:
        raise ValueError("not a 64-bit address")
    return value


def _unsigned(text: str) -> int:
    t = text.strip()
    if not t.isdigit() or not t.isascii():
        raise ValueError("not a decimal number")
    value = int(t)
    if value > _U64_MAX:
        raise ValueError("more than 64 bits")
    return value


def _stream_number(text: str) -> int:
    """xlog writes its stream id in decimal, RMM the cudaStream_t in hex."""
    t = text.strip()
    if t == "" or t == "(nil)":
        return 0
    if t.isdigit():
        return int(t)
    return _pointer(t)


@dataclasses.dataclass
class _Parsed:
    """Pass 1: the allocate/free rows of every device, and the counts."""

    format: str
    compressed: bool
    rows: int = 0
    bad_rows: int = 0
    bad_examples: List[Tuple[int, str]] = dataclasses.field(default_factory=list)
    ignored: Dict[str, int] = dataclasses.field(default_factory=dict)
    # device -> [(process, is_alloc, pointer, size, stream)]
    events: Dict[int, List[Tuple[str, bool, int, int, int]]] = dataclasses.field(default_factory=dict)
    device_order: List[int] = dataclasses.field(default_factory=list)


def _parse(path: str) -> _Parsed:
    f = _open_text(path)
    try:
        return _parse_stream(f, compressed=isinstance(f.buffer, gzip.GzipFile), path=path)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt gzip stream, a read error
        raise ReplayError(f"cannot read {path}: {e}") from None
    finally:
        f.close()


def _records(f: io.TextIOBase) -> Iterator[Tuple[int, Optional[List[str]], str]]:
    """(line number, fields or None, why not) per record. A line without a
    quote is split at its commas; a quoted field may run over the next
    lines (a tag with a newline), but a quote left open for more than
    `_MAX_QUOTED_LINES` lines makes its first line bad and the lines after
    it are read again, so one stray quote cannot swallow the log."""
    src = iter(f)
    back: List[Tuple[int, str]] = []  # lines to read again, the next one last
    count = 0

    def take() -> Optional[Tuple[int, str]]:
        nonlocal count
        if back:
            return back.pop()
        line = next(src, None)
        if line is None:
            return None
        count += 1
        return count, line

    while True:
        item = take()
        if item is None:
            return
        number, line = item
        if '"' not in line:
            yield number, line.rstrip("\r\n").split(","), ""
            continue
        parts = [line]
        quotes = line.count('"')
        taken: List[Tuple[int, str]] = []
        while quotes % 2 and len(taken) < _MAX_QUOTED_LINES:
            nxt = take()
            if nxt is None:
                break
            taken.append(nxt)
            parts.append(nxt[1])
            quotes += nxt[1].count('"')
        if quotes % 2:
            back.extend(reversed(taken))
            yield number, None, "a quote that is never closed"
            continue
        try:
            rows = list(csv.reader(io.StringIO("".join(parts))))
        except csv.Error as e:
            yield number, None, str(e)
            continue
        if len(rows) != 1:
            yield number, None, "not one CSV record"
            continue
        yield number, rows[0], ""


def _parse_stream(f: io.TextIOBase, compressed: bool, path: str) -> _Parsed:
    records = _records(f)
    header: Optional[List[str]] = None
    for _number, row, _why in records:
        if row and any(cell.strip() for cell in row):
            header = row
            break
    if header is None:
        raise ReplayError(f"{path} is empty: no header line")
    names = [h.strip().lstrip("\ufeff").lower() for h in header]

    def col(name: str) -> int:
        return names.index(name) if name in names else -1

    c_action, c_ptr, c_size = col("action"), col("pointer"), col("size")
    c_stream, c_device, c_process = col("stream"), col("device"), col("process")
    missing = [n for n, i in (("Action", c_action), ("Pointer", c_ptr), ("Size", c_size)) if i < 0]
    if missing:
        raise ReplayError(
            f"{path}: the header {header[:12]} lacks {', '.join(missing)}: not an xlog log "
            "(Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail) nor an RMM log "
            "(Thread,Time,Action,Pointer,Size,Stream)"
        )
    fmt = "xlog" if (c_device >= 0 or c_process >= 0 or col("tag") >= 0) else "rmm"
    out = _Parsed(format=fmt, compressed=compressed)
    need = max(c_action, c_ptr, c_size, c_stream, c_device, c_process) + 1
    ignored = out.ignored
    events = out.events

    def bad(number: int, why: str) -> None:
        out.bad_rows += 1
        if len(out.bad_examples) < _BAD_EXAMPLES:
            out.bad_examples.append((number, why))

    for number, row, why in records:
        if row is None:
            out.rows += 1
            bad(number, why)
            continue
        if len(row) == 1 and not row[0].strip():
            continue  # a blank line
        out.rows += 1
        if len(row) < need:
            bad(number, f"{len(row)} columns, {need} needed")
            continue
        action = row[c_action].strip().lower()
        is_alloc = action == _ALLOC
        if not is_alloc and action not in _FREES:
            if action == "action":
                action = "(header)"  # repeated by a second writer of a shared log
            elif action not in ignored and len(ignored) >= _MAX_ACTION_NAMES:
                action = "(other)"
            ignored[action] = ignored.get(action, 0) + 1
            continue
        try:
            ptr = _pointer(row[c_ptr])
        except ValueError:
            bad(number, f"pointer {row[c_ptr][:40]!r}")
            continue
        try:
            size = _unsigned(row[c_size])
        except ValueError:
            bad(number, f"size {row[c_size][:40]!r}")
            continue
        try:
            stream = _stream_number(row[c_stream]) if c_stream >= 0 else 0
        except ValueError:
            bad(number, f"stream {row[c_stream][:40]!r}")
            continue
        device = 0
        if c_device >= 0:
            try:
                device = int(row[c_device].strip())
            except ValueError:
                bad(number, f"device {row[c_device][:40]!r}")
                continue
        process = row[c_process].strip() if c_process >= 0 else ""
        per_device = events.get(device)
        if per_device is None:
            per_device = events[device] = []
            out.device_order.append(device)
        per_device.append((process, is_alloc, ptr, size, stream))
    return out


@dataclasses.dataclass
class Trace:
    """The replay of one device, ready to run: `ops` holds a block index
    `b` for its allocation and `~b` (negative) for its free, in log order;
    `sizes` (already divided by `scale`) and `block_stream` (an index into
    `streams`) describe the blocks."""

    path: str
    format: str
    compressed: bool
    device: int
    devices: Dict[int, int]
    rows: int
    allocate_rows: int
    free_rows: int
    ignored: Dict[str, int]
    bad_rows: int
    bad_examples: List[Tuple[int, str]]
    other_device_rows: int
    unknown_frees: int
    missed_frees: int
    null_rows: int
    streams: List[Tuple[str, int]]
    scale: int
    sizes: List[int]
    block_stream: List[int]
    ops: List[int]
    peak_live_bytes: int
    peak_live_blocks: int
    allocated_bytes: int
    left_live_blocks: int
    left_live_bytes: int

    def summary(self) -> Dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "compressed": self.compressed,
            "device": self.device,
            "devices": {str(d): n for d, n in self.devices.items()},
            "rows": self.rows,
            "allocate_rows": self.allocate_rows,
            "free_rows": self.free_rows,
            "ignored_rows": dict(self.ignored),
            "bad_rows": self.bad_rows,
            "bad_examples": [{"line": line, "why": why} for line, why in self.bad_examples],
            "other_device_rows": self.other_device_rows,
            "unknown_frees": self.unknown_frees,
            "missed_frees": self.missed_frees,
            "null_pointer_rows": self.null_rows,
            "streams": len(self.streams),
            "blocks": len(self.sizes),
            "scale": self.scale,
            "peak_live_bytes": self.peak_live_bytes,
            "peak_live_blocks": self.peak_live_blocks,
            "allocated_bytes": self.allocated_bytes,
            "left_live_blocks": self.left_live_blocks,
            "left_live_bytes": self.left_live_bytes,
        }


def _build(parsed: _Parsed, path: str, device: Optional[int], scale: int) -> Trace:
    if not parsed.device_order:
        raise ReplayError(f"{path}: no allocate or free rows ({parsed.rows} rows read)")
    if device is None:
        device = parsed.device_order[0]
    elif device not in parsed.events:
        listed = ", ".join(str(d) for d in sorted(parsed.events))
        raise ReplayError(f"{path}: no allocate or free rows for device {device} (devices in the log: {listed})")
    live: Dict[Tuple[str, int], int] = {}
    stream_index: Dict[Tuple[str, int], int] = {}
    streams: List[Tuple[str, int]] = []
    sizes: List[int] = []
    block_stream: List[int] = []
    ops: List[int] = []
    allocs = frees = unknown = missed = null = 0
    cur = peak = cur_blocks = peak_blocks = allocated = 0
    for process, is_alloc, ptr, size, stream in parsed.events[device]:
        if ptr == 0:  # a zero-byte allocation, or free(nullptr): nothing to replay
            null += 1
            continue
        key = (process, ptr)
        if is_alloc:
            allocs += 1
            old = live.pop(key, None)
            if old is not None:  # the address came back without a free row: the log missed it
                missed += 1
                ops.append(~old)
                cur -= sizes[old]
                cur_blocks -= 1
            skey = (process, stream)
            s = stream_index.get(skey)
            if s is None:
                s = stream_index[skey] = len(streams)
                streams.append(skey)
            nbytes = -(-size // scale)
            b = len(sizes)
            sizes.append(nbytes)
            block_stream.append(s)
            live[key] = b
            ops.append(b)
            allocated += nbytes
            cur += nbytes
            cur_blocks += 1
            if cur > peak:
                peak = cur
            if cur_blocks > peak_blocks:
                peak_blocks = cur_blocks
        else:
            frees += 1
            b = live.pop(key, None)
            if b is None:
                unknown += 1
                continue
            ops.append(~b)
            cur -= sizes[b]
            cur_blocks -= 1
    return Trace(
        path=path,
        format=parsed.format,
        compressed=parsed.compressed,
        device=device,
        devices={d: len(parsed.events[d]) for d in parsed.device_order},
        rows=parsed.rows,
        allocate_rows=allocs,
        free_rows=frees,
        ignored=dict(sorted(parsed.ignored.items(), key=lambda kv: -kv[1])),
        bad_rows=parsed.bad_rows,
        bad_examples=list(parsed.bad_examples),
        other_device_rows=sum(len(e) for d, e in parsed.events.items() if d != device),
        unknown_frees=unknown,
        missed_frees=missed,
        null_rows=null,
        streams=streams,
        scale=scale,
        sizes=sizes,
        block_stream=block_stream,
        ops=ops,
        peak_live_bytes=peak,
        peak_live_blocks=peak_blocks,
        allocated_bytes=allocated,
        left_live_blocks=cur_blocks,
        left_live_bytes=cur,
    )


def read_trace(path: str, device: Optional[int] = None, scale: int = 1) -> Trace:
    """Read the log at `path` and prepare the replay of `device` (None: the
    first device the log names) with every size divided by `scale`."""
    if scale < 1:
        raise ValueError("scale must be at least 1")
    return _build(_parse(path), path, device, scale)


# ---------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def default_capacity(peak_live: int, streams: int, budget: int = 0) -> int:
    """The sim capacity a replay gets: 2x the live peak plus 64 MiB a
    stream, rounded up to a GiB, at least 1 GiB and at least the budget."""
    want = 2 * peak_live + max(1, streams) * _STREAM_ALLOWANCE
    return max(GIB, _round_up(want, GIB), _round_up(budget, GIB))


def host_capacity_limit() -> int:
    """The largest sim capacity tried without scaling: 3/4 of the host's
    memory (the sim reserves its capacity in host address space)."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        phys = 16 * GIB
    return max(GIB, phys // 4 * 3 // GIB * GIB)


class GpuLag:
    """Keeps sim streams `n` to 2n operations behind the host, as a GPU
    runs behind its program, and deterministically so. `tick(done)`,
    before operation number `done` (every `n`), queues a host callback on
    every stream that holds it there, releases the callbacks queued two
    ticks ago and waits until every stream has reached the one queued at
    the last tick: at each tick every stream has run exactly what the host
    issued up to the tick before, and nothing runs between ticks, so a
    replay gives the same figures on a loaded machine as on an idle one.
    Each callback also gives up after 50 ms, so a wait for a stream inside
    xlog cannot deadlock (only such a wait makes a replay depend on
    timing). `release()` lets the streams run on (close waits for them).
    `n` 0: the streams run at once."""

    def __init__(self, streams: List[Any], n: int) -> None:
        self.streams = streams
        self.n = n
        # Each tick's (gate, arrived) pairs, one per stream, oldest first.
        self.ticks: List[List[Tuple[threading.Event, threading.Event]]] = []

    def tick(self, done: int) -> None:
        if not self.n or done % self.n:
            return
        queued = []
        for stream in self.streams:
            gate, arrived = threading.Event(), threading.Event()
            stream.enqueue_host(lambda g=gate, a=arrived: (a.set(), g.wait(0.05)))
            queued.append((gate, arrived))
        self.ticks.append(queued)
        if len(self.ticks) > 2:
            for gate, _ in self.ticks.pop(0):
                gate.set()
            for _, arrived in self.ticks[0]:
                arrived.wait(0.05)

    def release(self) -> None:
        for queued in self.ticks:
            for gate, _ in queued:
                gate.set()
        self.ticks.clear()


def replay(
    trace: Trace,
    memory: str = "arena",
    budget: int = 0,
    capacity: Optional[int] = None,
    cache: bool = True,
    reap_every: int = 0,
    gpu_lag: int = 0,
    check_access: bool = False,
) -> Dict[str, Any]:
    """Run `trace` through a fresh sim runtime; returns what happened.

    `check_access`: after each allocation and before each free, queue on
    the block's stream a check that its bytes are mapped with access for
    the device (`Runtime.sim_touch`), as the kernels using it would need,
    and that no other block uses its physical bytes meanwhile: with
    `gpu_lag` those run behind the host, so a page unmapped, moved or
    handed to another block before the stream is done with it is caught.
    The result counts the failures (`access_faults`, `first_access_fault`).

    `gpu_lag` N > 0 keeps the sim's streams N to 2N operations behind the
    host, as a GPU is behind the program that feeds it (`GpuLag`): every
    N operations a host callback is queued on each stream that holds it
    until the replay has issued 2N more (or 50 ms have passed, so a wait
    for a stream inside xlog cannot deadlock), and the replay waits until
    each stream has run up to the callback it queued N operations ago, so
    the figures do not depend on thread scheduling. Frees are then not known
    complete when the next allocations come, which is what a real trace
    meets; 0 (the default) lets every stream run at once.

    `budget` and `capacity` are in the trace's (scaled) bytes; `capacity`
    None: `default_capacity`. `reap_every` N > 0 calls `Runtime.reap()`
    (retire completed frees, never a wait) after every N operations,
    standing for the points where an application synchronises; the log
    does not say where they were. Refusals (out of budget or of sim
    memory) are counted and the block's free skipped. Raises
    CapacityRefusedError when the host cannot reserve the capacity, and
    ReplayError for any other error of the runtime."""
    from . import _errors
    from ._config import Config
    from ._runtime import Runtime

    if capacity is None:
        capacity = default_capacity(trace.peak_live_bytes, len(trace.streams), budget)
    config = Config(
        backend="sim",
        memory=memory,
        budget_bytes=budget,
        sim_capacity_bytes=capacity,
        stream_pool_size=max(16, len(trace.streams)),
        cache=cache,
    )
    try:
        rt = Runtime(device=0, config=config)
    except _errors.OutOfMemoryError as e:
        raise CapacityRefusedError(f"cannot open a sim runtime of {capacity:,} bytes: {e}") from None
    except _errors.XlogError as e:
        raise ReplayError(f"cannot open a sim runtime of {capacity:,} bytes ({memory}): {e}") from None
    refusals = refused_bytes = 0
    first_refusal = first_access_fault = ""
    access_faults = 0
    done = 0
    lag = GpuLag([], gpu_lag)
    started = time.perf_counter()
    try:
        streams = [rt.acquire_stream() for _ in trace.streams]
        lag.streams = streams
        by_block = [streams[s] for s in trace.block_stream]
        sizes = trace.sizes
        blocks: List[Any] = [None] * len(sizes)
        allocate = rt.allocate
        touch = rt.sim_touch if check_access else None
        refused = (_errors.OutOfBudgetError, _errors.OutOfMemoryError)
        countdown = reap_every
        for done, op in enumerate(trace.ops):
            lag.tick(done)
            if reap_every:
                countdown -= 1
                if countdown == 0:
                    rt.reap()
                    countdown = reap_every
            if op >= 0:
                try:
                    blocks[op] = allocate(sizes[op], by_block[op])
                except refused as e:
                    refusals += 1
                    refused_bytes += sizes[op]
                    if not first_refusal:
                        first_refusal = str(e)
                if touch is not None and blocks[op] is not None:
                    touch(by_block[op], blocks[op].ptr, sizes[op], "take")
            else:
                block = blocks[~op]
                if block is not None:  # None: its allocation was refused
                    if touch is not None:
                        touch(by_block[~op], block.ptr, sizes[~op], "give")
                    block.free()
                    blocks[~op] = None
        seconds = time.perf_counter() - started
        stats = rt.stats()
        if check_access:
            lag.release()
            for s in streams:
                s.synchronize()
            access_faults, first_access_fault = rt.sim_touch_faults()
        for block in blocks:
            if block is not None:
                block.free()
        for s in streams:
            s.release()
    except _errors.XlogError as e:
        raise ReplayError(f"the replay stopped at operation {done + 1:,} of {len(trace.ops):,}: {e}") from None
    finally:
        lag.release()
        rt.close()
    ops = len(trace.ops)
    return {
        "backend": "sim",
        "memory": memory,
        "cache": cache,
        "reap_every": reap_every,
        "gpu_lag": gpu_lag,
        "budget_bytes": budget,
        "capacity_bytes": capacity,
        "refusals": refusals,
        "refused_bytes": refused_bytes,
        "first_refusal": first_refusal,
        "check_access": check_access,
        "access_faults": access_faults,
        "first_access_fault": first_access_fault,
        "seconds": round(seconds, 3),
        "ops_per_second": round(ops / seconds) if seconds > 0 else None,
        "stats": dataclasses.asdict(stats),
    }


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _size_arg(text: str) -> int:
    from ._config import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _scale_arg(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1 or auto")
    return k


def _ratio_arg(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        r = float("nan")
    if not (r > 0 and math.isfinite(r)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number such as 1.10")
    return r


def _non_negative(text: str, what: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {what} >= 0")
    return n


def _count_arg(text: str) -> int:
    return _non_negative(text, "a whole number")


def _device_arg(text: str) -> int:
    return _non_negative(text, "a device number")


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / MIB:,.1f}"


def format_report(result: Dict[str, Any]) -> str:
    """The text table of a result (as `run` returns it)."""
    t = result["trace"]
    r = result["replay"]
    s = r["stats"]
    live = t["peak_live_bytes"]
    lines = []
    kind = ("xlog" if t["format"] == "xlog" else "RMM") + " log" + (", gzip" if t["compressed"] else "")
    devices = ", ".join(f"{d}: {n:,}" for d, n in t["devices"].items())
    lines.append(f"replay of {t['path']} ({kind})")
    lines.append(
        f"  device {t['device']} (allocate/free rows per device: {devices}); {t['rows']:,} rows: "
        f"{t['allocate_rows']:,} allocate, {t['free_rows']:,} free, {t['bad_rows']:,} bad"
    )
    ignored = ", ".join(f"{a} {n:,}" for a, n in t["ignored_rows"].items()) or "none"
    lines.append(f"  ignored rows: {ignored}")
    odd = [
        (t["other_device_rows"], "rows of other devices"),
        (t["unknown_frees"], "frees of pointers never allocated"),
        (t["missed_frees"], "allocations of a live pointer (free missing)"),
        (t["null_pointer_rows"], "null-pointer rows"),
        (t["left_live_blocks"], f"block(s) never freed ({t['left_live_bytes']:,} bytes)"),
    ]
    odd_text = "; ".join(f"{n:,} {what}" for n, what in odd if n)
    if odd_text:
        lines.append(f"  skipped or noted: {odd_text}")
    for ex in t["bad_examples"]:
        lines.append(f"  bad row at line {ex['line']}: {ex['why']}")
    scale = t["scale"]
    scale_note = f"sizes / {scale}" + (" (auto: the live peak needs more sim capacity than this host gives)"
                                        if result.get("scale_auto") and scale > 1 else "")
    lines.append(
        f"  replayed on sim: memory {r['memory']}, cache {'on' if r['cache'] else 'off'}, "
        f"budget {_mib(r['budget_bytes']) + ' MiB' if r['budget_bytes'] else 'none'}, "
        f"capacity {_mib(r['capacity_bytes'])} MiB, {t['streams']} stream(s), {t['blocks']:,} blocks, "
        + (f"reap every {r['reap_every']:,} ops, " if r["reap_every"] else "")
        + (scale_note if scale > 1 else "unscaled")
        + f"; {r['seconds']:.2f} s"
    )
    lines.append("")
    lines.append(f"  {'':<22}{'bytes':>16}{'MiB':>12}{'/ trace live':>14}")

    def row(name: str, value: int) -> None:
        ratio = f"{value / live:.3f}" if live else "-"
        lines.append(f"  {name:<22}{value:>16,}{_mib(value):>12}{ratio:>14}")

    row("trace peak live", live)
    row("xlog peak held", s["peak_outstanding_bytes"])
    row("xlog peak live", s["peak_live_bytes"])
    lines.append("")
    lines.append(
        f"  refusals {r['refusals']:,} (xlog failed_allocations {s['failed_allocations']:,}); "
        f"cache hits {s['cache_hits']:,}, misses {s['cache_misses']:,}; "
        f"allocations {s['allocations']:,}, frees {s['deallocations']:,}"
    )
    if r["memory"] == "arena":
        lines.append(
            f"  pages mapped {s.get('pages_mapped', 0):,}, unmapped {s.get('pages_unmapped', 0):,} "
            "(on a GPU each costs tens of microseconds of driver calls)"
        )
    if r["refusals"]:
        lines.append(f"  first refusal: {r['first_refusal']}")
        if not r["budget_bytes"]:
            lines.append("  warning: refusals without a budget: the sim capacity was too small (try --capacity)")
    lines.append(
        f"  held at the end {_mib(s['outstanding_bytes'])} MiB: live {_mib(s['live_bytes'])}, "
        f"cached {_mib(s['cached_bytes'])}, pending {_mib(s['pending_bytes'])} MiB"
    )
    if r.get("check_access"):
        lines.append(f"  access checks: {r['access_faults']:,} failed" +
                     (f"; {r['first_access_fault']}" if r["access_faults"] else ""))
    ratio = result["held_ratio"]
    bound = result["max_held_ratio"]
    verdict = f"held / live {ratio:.3f}" if ratio is not None else "held / live: no live bytes in the trace"
    if bound is not None:
        verdict += f"; bound {bound:g}: " + ("ok" if result["bound_ok"] else "EXCEEDED")
    lines.append("  " + verdict)
    return "\n".join(lines)


def run(
    path: str,
    memory: str = "arena",
    budget: int = 0,
    capacity: Optional[int] = None,
    device: Optional[int] = None,
    scale: int = 0,
    cache: bool = True,
    max_held_ratio: Optional[float] = None,
    reap_every: int = 0,
    gpu_lag: int = 0,
    check_access: bool = False,
) -> Dict[str, Any]:
    """Read, replay and judge one log; `scale` 0 means auto. Returns the
    result (what --json writes). Raises ReplayError (exit 2)."""
    parsed = _parse(path)
    auto = scale == 0
    k = scale or 1
    trace = _build(parsed, path, device, k)
    if auto and capacity is None:
        limit = host_capacity_limit()
        while default_capacity(trace.peak_live_bytes, len(trace.streams), budget // k) > limit and k < (1 << 20):
            k *= 2
            trace = _build(parsed, path, device, k)
    while True:
        scaled_budget = max(1, budget // k) if budget else 0
        try:
            rep = replay(trace, memory=memory, budget=scaled_budget, capacity=capacity, cache=cache,
                         reap_every=reap_every, gpu_lag=gpu_lag, check_access=check_access)
            break
        except CapacityRefusedError as e:
            if auto and capacity is None and k < (1 << 20):
                k *= 2  # the host refused the reservation: scale down further
                trace = _build(parsed, path, device, k)
                continue
            hint = "a smaller --capacity, or " if capacity is not None else ""
            raise ReplayError(f"{e}; try {hint}--scale K (sizes divided by K) or --scale auto") from None
    live = trace.peak_live_bytes
    held = rep["stats"]["peak_outstanding_bytes"]
    ratio = held / live if live else None
    bound_ok = True
    if max_held_ratio is not None and ratio is not None:
        bound_ok = ratio <= max_held_ratio
    return {
        "trace": trace.summary(),
        "scale_auto": auto,
        "replay": rep,
        "held_ratio": None if ratio is None else round(ratio, 6),
        "max_held_ratio": max_held_ratio,
        "bound_ok": bound_ok,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m xlog_cuda.replay",
        description="Replay an xlog or RMM allocation log (CSV, or .gz) through xlog on the sim backend and "
        "report xlog's peak held and live bytes against the trace's live peak.",
        epilog="Exit status: 0 done, 1 the held/live bound (--max-held-ratio) exceeded or an access check failed, "
        "2 bad arguments, an unreadable log or a runtime that cannot be opened.",
    )
    ap.add_argument("log", help="the log: xlog's CSV (XLOG_LOG_PATH) or RMM's logging_resource_adaptor CSV, "
                    "plain or gzip-compressed")
    ap.add_argument("--memory", choices=("arena", "pool"), default="arena",
                    help="xlog's memory: its arena (default) or the driver pool")
    ap.add_argument("--budget", type=_size_arg, default=0, metavar="SIZE",
                    help="a budget (e.g. 2GiB), in the log's bytes; default none")
    ap.add_argument("--capacity", type=_size_arg, default=None, metavar="SIZE",
                    help="the sim device's memory, in replayed bytes (default: 2x the live peak + 64 MiB a "
                    "stream, rounded up to a GiB)")
    ap.add_argument("--device", type=_device_arg, default=None, metavar="N",
                    help="replay the rows of device N (default: the first device the log names)")
    ap.add_argument("--scale", type=_scale_arg, default=0, metavar="K",
                    help="divide every size (and the budget) by K; auto (default): 1 unless the sim "
                    "capacity needed exceeds this host's memory")
    ap.add_argument("--no-cache", action="store_true", help="replay with xlog's cache off")
    ap.add_argument("--reap-every", type=_count_arg, default=0, metavar="N",
                    help="call reap() after every N operations (default 0: never; the log does not say "
                    "where the application synchronised)")
    ap.add_argument("--gpu-lag", type=_count_arg, default=0, metavar="N",
                    help="keep the sim's streams N to 2N operations behind the host, as a GPU runs behind "
                    "its program (default 0: streams run at once)")
    ap.add_argument("--check-access", action="store_true",
                    help="check in stream order, after each allocation and before each free, that the block is "
                    "mapped with access for the device, as its kernels need (with --gpu-lag, behind the host); "
                    "any failure is reported and exits 1")
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE ('-': stdout)")
    ap.add_argument("--max-held-ratio", type=_ratio_arg, default=None, metavar="R",
                    help="exit 1 when xlog's peak held / the trace's live peak exceeds R (e.g. 1.10)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    args = ap.parse_args(argv)
    try:
        result = run(
            args.log,
            memory=args.memory,
            budget=args.budget,
            capacity=args.capacity,
            device=args.device,
            scale=args.scale,
            cache=not args.no_cache,
            max_held_ratio=args.max_held_ratio,
            reap_every=args.reap_every,
            gpu_lag=args.gpu_lag,
            check_access=args.check_access,
        )
    except ReplayError as e:
        print(f"xlog_cuda.replay: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as e:  # the library cannot be found (LibraryNotFoundError)
        print(f"xlog_cuda.replay: {e}", file=sys.stderr)
        return EXIT_USAGE
    text = format_report(result)
    if args.json:
        try:
            if args.json == "-":
                json.dump(result, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=2)
                    f.write("\n")
        except OSError as e:
            print(f"xlog_cuda.replay: cannot write {args.json}: {e.strerror or e}", file=sys.stderr)
            return EXIT_USAGE
    if args.json != "-":
        print(text.splitlines()[-1].strip() if args.quiet else text)
    failed = not result["bound_ok"] or result["replay"]["access_faults"]
    return EXIT_BOUND if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""A memory report from xlog's CSV log: one self-contained HTML page.

    python -m xlog_cuda.report LOG.csv -o report.html [--png report.png]

The log is the one `XLOG_LOG_PATH` (or `log_path=`) writes:
`Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail`, one
row per event (RMM's six-column logs read too). The page
works offline (no network, no CDN: the data and the code are inline) and
shows

- live bytes over time, stacked by tag, or by stream (a toggle), with the
  largest tags or streams named and the rest summed as "other";
- the peak moment and the blocks live at it, largest first;
- a histogram of allocation sizes (powers of two);
- leaks: blocks the log allocated and never freed, and the `leak` rows the
  runtime writes at close;
- refusals (`allocate failure` rows, and any action that says it refused
  or failed), with their messages (the `Detail` column);
- a table per tag and per stream, and the rows it did not use.

Reading is streaming: one pass over the file keeps the blocks live at the
moment and a few compact arrays per event; the time series is then
resampled to a fixed number of points (each point is the moment of the
largest total in its interval, so no peak is lost). A 1,000,000-line log
renders in a few seconds.

xlog's driver-traffic rows (`reserve`: memory taken from the driver,
`release`: handed back, `retire`: seen complete) give what the runtime
held besides live memory: the page shows the peak of live + cached +
pending and what was held at the end (`held` in the data; absent for logs
without such rows, such as RMM's). Other actions are counted and listed,
and otherwise left out. Rows that cannot be read are counted and the first
few are shown, never fatal: too few columns, a size that is not a whole
number from 0 to 2**63 - 1, a field longer than the csv module's limit
(131,072 characters). A time that is not a time of day or plain seconds
(from 0 up to 1e11: not NaN, infinite or negative) is left out, and the row
keeps the time of the row before it. A header repeated by another writer
of a shared log file is skipped. RMM's logs and files edited by hand are
read under the same rules.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import html
import json
import os
import re
import sys
import time
from array import array
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

__all__ = ["analyze", "render_html", "render_png", "write_report", "main", "ReportError"]

DEFAULT_POINTS = 1200
DEFAULT_TOP = 10
DEFAULT_BLOCKS = 500  # blocks drawn in the per-block lifetime view (the largest)
MAX_LISTED = 200  # blocks / refusals / bad rows listed in the page
OTHER = "(other)"
# The log's columns: xlog's ten (src/resources/logging.rs, CSV_HEADER) and
# RMM's logging adaptor's six, which are xlog's first six.
XLOG_COLUMNS = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail"
RMM_COLUMNS = "Thread,Time,Action,Pointer,Size,Stream"


_KNOWN = frozenset(("allocate", "free", "leak", "allocate failure", "reserve", "release", "retire"))
# xlog's driver-traffic actions: with them, cached and pending bytes are
# rebuilt next to live ones (live = allocate - free; cached = reserve -
# allocate + free - release; pending = release - retire).
_DRIVER = frozenset(("reserve", "release", "retire"))


# Times are seconds since midnight (or plain seconds): one that is not in
# [0, _MAX_CLOCK) is no time at all (the row keeps the time before it).
_MAX_CLOCK = 1e11

# Sizes are kept in signed 64-bit arrays: a row giving more (or a negative
# size) is a bad row, counted and shown, never a crash.
_MAX_SIZE = (1 << 63) - 1


class ReportError(Exception):
    """The log cannot be turned into a report (no header, unreadable)."""


def _size_of(text: str) -> Tuple[Optional[int], str]:
    """(the size a row gives, "") or (None, why it is not one)."""
    shown = text if len(text) <= 40 else text[:40] + "..."
    try:
        size = int(text)
    except ValueError:
        return None, f"size {shown!r}"
    if size < 0:
        return None, f"size {shown} is negative"
    if size > _MAX_SIZE:
        return None, f"size {shown} is over 2**63 - 1"
    return size, ""


def _size_or_zero(text: str) -> int:
    """The size of a row that only reports it (leak, refusal): 0 when it
    gives none that can be read."""
    size, _ = _size_of(text)
    return 0 if size is None else size


def _rows(reader: Any, unreadable: Any):
    """The reader's rows; a row the csv module refuses (a field past its
    field size limit, 131,072 characters by default) goes to
    `unreadable(why)` and reading goes on at the next line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            unreadable(str(e))
            continue
        yield row


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


def _clock_seconds(text: str) -> float:
    """Seconds since midnight from "HH:MM:SS.ffffff" (xlog and RMM), or
    "HH:MM:SS:uuuuuu" (the form RMM's parser documents), or plain seconds."""
    parts = text.split(":")
    if len(parts) == 3:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + float(parts[2])
    if len(parts) == 4:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + int(parts[2]) + int(parts[3]) / 1e6
    return float(text)


def _is_refusal(action: str) -> bool:
    a = action.lower()
    return "fail" in a or "refus" in a or "oom" in a or "out of" in a


class _Columns:
    """Where each field is, found by name in the header (order-tolerant)."""

    def __init__(self, header: Sequence[str]):
        names = [h.strip().lower() for h in header]
        self.width = len(names)

        def find(*candidates: str) -> int:
            for c in candidates:
                if c in names:
                    return names.index(c)
            return -1

        self.thread = find("thread")
        self.time = find("time")
        self.action = find("action")
        self.pointer = find("pointer")
        self.size = find("size")
        self.stream = find("stream")
        self.tag = find("tag")
        self.message = find("detail", "message", "reason", "error")
        missing = [n for n, i in (("Action", self.action), ("Pointer", self.pointer), ("Size", self.size)) if i < 0]
        if missing:
            raise ReportError(
                f"the header {list(header)} lacks {', '.join(missing)}: not an xlog (or RMM) memory log. "
                f"xlog writes the 10 columns {XLOG_COLUMNS}; RMM's logging adaptor the 6 columns {RMM_COLUMNS}. "
                "Columns are found by name, in any order; Action, Pointer and Size are required"
            )


def analyze(path: str, points: int = DEFAULT_POINTS, top: int = DEFAULT_TOP,
            blocks: int = DEFAULT_BLOCKS) -> Dict[str, Any]:
    """Read the log at `path` and return the report's data (what the page
    embeds as JSON). `points`: samples of the time series; `top`: tags and
    streams named in the charts (the rest are summed as "(other)"); `blocks`:
    the largest blocks drawn in the per-block lifetime view."""
    started = time.perf_counter()
    try:
        f = open(path, newline="", encoding="utf-8", errors="replace")
    except OSError as e:
        raise ReportError(f"cannot open {path}: {e}") from e
    with f:
        data = _analyze_stream(f, points=max(2, points), top=max(1, top), blocks=max(0, blocks))
    data["source"] = os.path.abspath(path)
    data["source_name"] = os.path.basename(path)
    data["seconds_to_read"] = round(time.perf_counter() - started, 3)
    return data


def _analyze_stream(f: TextIO, points: int, top: int, blocks: int = 0) -> Dict[str, Any]:
    reader = csv.reader(f)
    header = None

    def unreadable_header(why: str) -> None:
        raise ReportError(f"the header cannot be read: {why}")

    for row in _rows(reader, unreadable_header):
        if row and any(cell.strip() for cell in row):
            header = row
            break
    if header is None:
        raise ReportError("the log is empty (no header line)")
    cols = _Columns(header)
    c_thread, c_time, c_action, c_ptr, c_size = cols.thread, cols.time, cols.action, cols.pointer, cols.size
    c_stream, c_tag, c_msg, width = cols.stream, cols.tag, cols.message, cols.width
    need = max(c_action, c_ptr, c_size) + 1

    tag_ids: Dict[str, int] = {}
    tag_names: List[str] = []
    stream_ids: Dict[str, int] = {}
    stream_names: List[str] = []

    # Per event (allocate or matched free), in log order.
    ev_t = array("d")
    ev_delta = array("q")
    ev_tag = array("i")
    ev_stream = array("i")
    # Per allocation ("block"), in log order.
    b_size = array("q")
    b_tag = array("i")
    b_stream = array("i")
    b_t = array("d")
    b_alloc_ev = array("q")
    b_free_ev = array("q")
    b_line = array("q")
    b_ptr: List[str] = []
    b_site = array("i")  # index into site_names; -1: the row names none
    site_ids: Dict[str, int] = {}
    site_names: List[str] = []

    live: Dict[str, int] = {}  # pointer text -> block index
    tag_live: List[int] = []
    tag_peak: List[int] = []
    tag_allocs: List[int] = []
    tag_bytes: List[int] = []
    stream_live: List[int] = []
    stream_peak: List[int] = []
    stream_allocs: List[int] = []
    stream_bytes: List[int] = []
    hist_count: Dict[int, int] = {}
    hist_bytes: Dict[int, int] = {}

    counts = {"allocate": 0, "free": 0, "leak": 0, "refusal": 0}
    other_actions: Dict[str, int] = {}
    bad_rows: List[Dict[str, Any]] = []
    bad_count = 0
    unmatched_free = 0
    unmatched_free_bytes = 0
    realloc_live = 0
    refusals: List[Dict[str, Any]] = []
    refusal_count = 0
    refusal_bytes = 0
    leak_rows: List[Dict[str, Any]] = []
    leak_row_count = 0
    # Driver traffic (reserve/release/retire rows): cached and pending.
    driver_counts = {"reserve": 0, "release": 0, "retire": 0}
    cached = 0
    pending = 0
    held_peak = -1
    held_peak_at: Dict[str, Any] = {}

    total = 0
    peak = -1
    peak_ev = -1
    t_offset = 0.0
    last_raw = None
    last_t = 0.0
    first_clock: Optional[str] = None
    last_clock: Optional[str] = None
    line = 1
    threads = set()
    minute_base: Dict[str, int] = {}

    def tag_of(row: List[str]) -> int:
        name = row[c_tag] if 0 <= c_tag < len(row) else ""
        i = tag_ids.get(name)
        if i is None:
            i = tag_ids[name] = len(tag_names)
            tag_names.append(name)
            tag_live.append(0)
            tag_peak.append(0)
            tag_allocs.append(0)
            tag_bytes.append(0)
        return i

    def stream_of(row: List[str]) -> int:
        name = row[c_stream].strip() if 0 <= c_stream < len(row) else ""
        i = stream_ids.get(name)
        if i is None:
            i = stream_ids[name] = len(stream_names)
            stream_names.append(name)
            stream_live.append(0)
            stream_peak.append(0)
            stream_allocs.append(0)
            stream_bytes.append(0)
        return i

    def message_of(row: List[str]) -> str:
        if c_msg >= 0 and c_msg < len(row):
            return row[c_msg]
        if len(row) > width:  # unnamed trailing columns
            return ",".join(row[width:])
        return ""

    def unreadable(why: str) -> None:
        nonlocal line, bad_count
        line += 1
        bad_count += 1
        if len(bad_rows) < 20:
            bad_rows.append({"line": line, "why": why, "row": ""})

    for row in _rows(reader, unreadable):
        line += 1
        if len(row) < need:
            if not row or not any(cell.strip() for cell in row):
                continue  # blank line
            bad_count += 1
            if len(bad_rows) < 20:
                bad_rows.append({"line": line, "why": f"{len(row)} columns", "row": ",".join(row)[:300]})
            continue
        action = row[c_action]
        if action not in _KNOWN:
            action = action.strip()
            if action == "Action":
                continue  # a header repeated by another writer of the file
        # Time: seconds since the log's midnight, unwrapped across midnights.
        t = last_t
        if c_time >= 0 and c_time < len(row):
            raw = row[c_time]
            if raw != last_raw:
                clock = None
                # The common "HH:MM:SS.ffffff": the minute's base is cached.
                if len(raw) > 6 and raw[2] == ":" and raw[5] == ":" and raw.count(":") == 2:
                    base = minute_base.get(raw[:5])
                    try:
                        if base is None:
                            base = minute_base[raw[:5]] = int(raw[:2]) * 3600 + int(raw[3:5]) * 60
                        clock = base + float(raw[6:])
                    except ValueError:
                        clock = None
                else:
                    try:
                        clock = _clock_seconds(raw)
                    except ValueError:
                        clock = None
                if clock is not None and not 0.0 <= clock < _MAX_CLOCK:
                    clock = None  # NaN, infinite, negative or absurd: no time
                if clock is not None:
                    if last_raw is not None and clock + t_offset < last_t - 43200:
                        t_offset += 86400.0
                    t = clock + t_offset
                    last_raw = raw
                    if first_clock is None:
                        first_clock = raw
                    last_clock = raw
            else:
                t = last_t
        last_t = t
        if c_thread >= 0:
            threads.add(row[c_thread] if c_thread < len(row) else "")

        if action in _DRIVER or action in ("allocate", "free"):
            # Every row that moves bytes needs its size.
            size, why = _size_of(row[c_size])
            if size is None:
                bad_count += 1
                if len(bad_rows) < 20:
                    bad_rows.append({"line": line, "why": why, "row": ",".join(row)[:300]})
                continue
        if action in _DRIVER:
            driver_counts[action] += 1
            if action == "reserve":
                cached += size
            elif action == "release":
                cached -= size
                pending += size
            else:
                pending -= size
            if total + cached + pending > held_peak:
                held_peak = total + cached + pending
                held_peak_at = {"t": t, "clock": row[c_time] if 0 <= c_time < len(row) else "", "live": total,
                                "cached": cached, "pending": pending}
            continue
        if action == "allocate" or action == "free":
            ptr = row[c_ptr]
            # Live bytes move to and from the cache (meaningful when the
            # log has reserve rows).
            cached += -size if action == "allocate" else size
            if action == "allocate":
                counts["allocate"] += 1
                old = live.pop(ptr, None)
                if old is not None:
                    # The same address again without a free (a log that
                    # lost rows, or two devices in one file): end the old
                    # block here.
                    realloc_live += 1
                    _end_block(old, t, b_size, b_tag, b_stream, b_free_ev, ev_t, ev_delta, ev_tag, ev_stream,
                               tag_live, stream_live)
                    total -= b_size[old]
                ti = tag_of(row)
                si = stream_of(row)
                block = len(b_size)
                b_size.append(size)
                b_tag.append(ti)
                b_stream.append(si)
                b_t.append(t)
                b_alloc_ev.append(len(ev_t))
                b_free_ev.append(-1)
                b_line.append(line)
                b_ptr.append(ptr)
                # Detail of an allocate row: its call site (a runtime that
                # tracks them writes it; empty otherwise).
                site_text = row[c_msg].strip() if 0 <= c_msg < len(row) else ""
                if site_text:
                    si_ = site_ids.get(site_text)
                    if si_ is None:
                        si_ = site_ids[site_text] = len(site_names)
                        site_names.append(site_text)
                    b_site.append(si_)
                else:
                    b_site.append(-1)
                live[ptr] = block
                ev_t.append(t)
                ev_delta.append(size)
                ev_tag.append(ti)
                ev_stream.append(si)
                total += size
                v = tag_live[ti] + size
                tag_live[ti] = v
                if v > tag_peak[ti]:
                    tag_peak[ti] = v
                v = stream_live[si] + size
                stream_live[si] = v
                if v > stream_peak[si]:
                    stream_peak[si] = v
                tag_allocs[ti] += 1
                tag_bytes[ti] += size
                stream_allocs[si] += 1
                stream_bytes[si] += size
                k = size.bit_length()
                hist_count[k] = hist_count.get(k, 0) + 1
                hist_bytes[k] = hist_bytes.get(k, 0) + size
                if total > peak:
                    peak = total
                    peak_ev = len(ev_t) - 1
            else:
                counts["free"] += 1
                block = live.pop(ptr, None)
                if block is None:
                    unmatched_free += 1
                    unmatched_free_bytes += size
                    continue
                _end_block(block, t, b_size, b_tag, b_stream, b_free_ev, ev_t, ev_delta, ev_tag, ev_stream,
                           tag_live, stream_live)
                total -= b_size[block]
        elif action == "leak":
            counts["leak"] += 1
            leak_row_count += 1
            ptr = row[c_ptr]
            block = live.get(ptr)
            if len(leak_rows) < 5000:
                size = _size_or_zero(row[c_size])
                leak_rows.append({"ptr": ptr, "size": size, "tag": row[c_tag] if 0 <= c_tag < len(row) else "",
                                  "stream": row[c_stream].strip() if 0 <= c_stream < len(row) else "",
                                  "line": line, "block": block})
        elif _is_refusal(action):
            counts["refusal"] += 1
            refusal_count += 1
            size = _size_or_zero(row[c_size])
            refusal_bytes += size
            if len(refusals) < MAX_LISTED:
                refusals.append({"t": t, "clock": row[c_time] if 0 <= c_time < len(row) else "", "action": action,
                                 "size": size, "tag": row[c_tag] if 0 <= c_tag < len(row) else "",
                                 "stream": row[c_stream].strip() if 0 <= c_stream < len(row) else "",
                                 "thread": row[c_thread] if 0 <= c_thread < len(row) else "",
                                 "message": message_of(row), "line": line})
        else:
            other_actions[action] = other_actions.get(action, 0) + 1

    n_ev = len(ev_t)
    t0 = ev_t[0] if n_ev else 0.0
    t1 = ev_t[n_ev - 1] if n_ev else 0.0

    # ---- named series: the `top` tags and streams by peak live bytes ----
    def pick(names: List[str], peaks: List[int]) -> Tuple[List[str], List[int]]:
        order = sorted(range(len(names)), key=lambda i: -peaks[i])
        named = order[:top] if len(order) > top + 1 else order
        slot = [len(named)] * len(names)
        for k, i in enumerate(named):
            slot[i] = k
        labels = [names[i] if names[i] != "" else "(no tag)" for i in named]
        if len(named) < len(names):
            labels.append(OTHER)
        return labels, slot

    tag_labels, tag_slot = pick(tag_names, tag_peak)
    stream_labels, stream_slot = pick(stream_names, stream_peak)
    series = _resample(ev_t, ev_delta, ev_tag, ev_stream, tag_slot, stream_slot, len(tag_labels),
                       len(stream_labels), points, t0, t1)

    # ---- the peak moment: blocks allocated at or before it, freed after ----
    peak_blocks: List[Dict[str, Any]] = []
    peak_t = ev_t[peak_ev] if peak_ev >= 0 else 0.0
    if peak_ev >= 0:
        at_peak = [b for b in range(len(b_size)) if b_alloc_ev[b] <= peak_ev and (b_free_ev[b] < 0 or b_free_ev[b] > peak_ev)]
        at_peak.sort(key=lambda b: -b_size[b])
        peak_count = len(at_peak)
        by_tag_at_peak: Dict[str, List[int]] = {}
        for b in at_peak:
            e = by_tag_at_peak.setdefault(tag_names[b_tag[b]], [0, 0])
            e[0] += 1
            e[1] += b_size[b]
        for b in at_peak[:MAX_LISTED]:
            j = _block_json(b, b_size, b_tag, b_stream, b_t, b_line, b_ptr, tag_names, stream_names, peak_t, t0)
            if site_names:
                j["site"] = site_names[b_site[b]] if b_site[b] >= 0 else ""
            peak_blocks.append(j)
    else:
        peak_count = 0
        by_tag_at_peak = {}
        at_peak = []

    # ---- leaks: never freed in the log, and the blocks of `leak` rows (the
    # runtime writes one per block still live at close, then frees it) ----
    never_freed = list(live.values())
    reported = {r["block"] for r in leak_rows if r["block"] is not None}
    leaked = sorted(set(never_freed) | reported, key=lambda b: -b_size[b])
    leak_by_tag: Dict[str, List[int]] = {}
    for b in leaked:
        e = leak_by_tag.setdefault(tag_names[b_tag[b]], [0, 0])
        e[0] += 1
        e[1] += b_size[b]
    leak_list = []
    for b in leaked[:MAX_LISTED]:
        j = _block_json(b, b_size, b_tag, b_stream, b_t, b_line, b_ptr, tag_names, stream_names, t1, t0)
        j["reported"] = b in reported
        if site_names:
            j["site"] = site_names[b_site[b]] if b_site[b] >= 0 else ""
        j["freed_in_log"] = b_free_ev[b] >= 0
        leak_list.append(j)
    orphan_leaks = [r for r in leak_rows if r["block"] is None][:MAX_LISTED]
    for r in orphan_leaks:
        r.pop("block", None)

    # ---- tables ----
    def table(names, peaks, allocs, byts, lives, kind):
        rows = []
        for i, name in enumerate(names):
            rows.append({kind: name, "allocations": allocs[i], "bytes_allocated": byts[i], "peak_live": peaks[i],
                         "live_at_end": lives[i]})
        rows.sort(key=lambda r: -r["peak_live"])
        return rows

    hist = []
    for k in sorted(hist_count):
        lo = 0 if k == 0 else 1 << (k - 1)
        hi = 0 if k == 0 else (1 << k) - 1
        hist.append({"lo": lo, "hi": hi, "count": hist_count[k], "bytes": hist_bytes[k]})

    live_end = sum(b_size[b] for b in never_freed)
    axis_is_time = series["axis"] == "time"
    return {
        "format": 1,
        "lines": line,
        "header": list(header),
        "counts": counts,
        "other_actions": dict(sorted(other_actions.items(), key=lambda kv: -kv[1])),
        "bad_rows": {"count": bad_count, "first": bad_rows},
        "unmatched_frees": {"count": unmatched_free, "bytes": unmatched_free_bytes},
        "reused_live_pointers": realloc_live,
        "threads": len(threads),
        "first_clock": first_clock,
        "last_clock": last_clock,
        "duration_s": t1 - t0,
        "events": n_ev,
        "series": series,
        "tag_labels": tag_labels,
        "stream_labels": stream_labels,
        "peak": {
            "bytes": max(peak, 0),
            "t": peak_t - t0,
            "clock": _clock_text(peak_t),
            "event": peak_ev,
            "blocks": peak_count,
            "listed": peak_blocks,
            "by_tag": sorted(([k, v[0], v[1]] for k, v in by_tag_at_peak.items()), key=lambda x: -x[2]),
        },
        "live_at_end": {"bytes": live_end, "blocks": len(never_freed)},
        "histogram": hist,
        "tags": table(tag_names, tag_peak, tag_allocs, tag_bytes, tag_live, "tag"),
        "streams": table(stream_names, stream_peak, stream_allocs, stream_bytes, stream_live, "stream"),
        "leaks": {
            "blocks": len(leaked),
            "bytes": sum(b_size[b] for b in leaked),
            "never_freed": len(never_freed),
            "never_freed_bytes": live_end,
            "reported_rows": leak_row_count,
            "listed": leak_list,
            "reported_not_allocated_in_log": orphan_leaks,
            "by_tag": sorted(([k, v[0], v[1]] for k, v in leak_by_tag.items()), key=lambda x: -x[2]),
        },
        "refusals": {"count": refusal_count, "bytes": refusal_bytes, "listed": refusals},
        "held": _held_json(driver_counts, total, cached, pending, held_peak, held_peak_at, t0),
        "call_sites": _call_sites_json(site_names, b_site, b_size, at_peak, never_freed, len(b_size)),
        "lifetimes": _lifetimes_json(b_size, b_tag, b_site, b_ptr, b_alloc_ev, b_free_ev, ev_t, t0, axis_is_time,
                                     tag_names, site_names, blocks),
    }


def _group_by_site(blocks_, b_site, b_size, site_names) -> List[Dict[str, Any]]:
    """`blocks_` grouped by call site: [{stack, blocks, bytes}], most bytes
    first (ties by stack), "" for blocks whose row named none."""
    groups: Dict[int, List[int]] = {}
    for b in blocks_:
        e = groups.setdefault(b_site[b], [0, 0])
        e[0] += 1
        e[1] += b_size[b]
    rows = [{"stack": site_names[k] if k >= 0 else "", "blocks": v[0], "bytes": v[1]} for k, v in groups.items()]
    rows.sort(key=lambda r: (-r["bytes"], r["stack"]))
    return rows[:MAX_LISTED]


def _call_sites_json(site_names, b_site, b_size, at_peak, never_freed, n_blocks) -> Dict[str, Any]:
    """Call sites, when the log's allocate rows carry them (Detail, written
    with track_call_sites): the blocks live at the peak and at the end of
    the log grouped by call stack. `known` is False (and nothing else is
    given) for a log without them."""
    if not site_names:
        return {"known": False}
    with_site = sum(1 for b in range(n_blocks) if b_site[b] >= 0)
    return {
        "known": True,
        "sites": len(site_names),
        "allocations_with_site": with_site,
        "allocations": n_blocks,
        "at_peak": _group_by_site(at_peak, b_site, b_size, site_names),
        "at_end": _group_by_site(never_freed, b_site, b_size, site_names),
    }


def _lifetimes_json(b_size, b_tag, b_site, b_ptr, b_alloc_ev, b_free_ev, ev_t, t0, axis_is_time, tag_names,
                    site_names, limit) -> Dict[str, Any]:
    """Each block's lifetime, for the per-block view: the `limit` largest
    blocks (ties: the earlier first), listed in allocation order as
    [start, end, size, tag, site, address, block]. start and end are on the
    timeline's axis (seconds since the first event, or event numbers when
    the log's times do not advance); end is null for a block never freed
    in the log; tag and site index `tags` and `sites` (site -1: none);
    address is the pointer as a number (null when it is not hex)."""
    n = len(b_size)
    chosen = sorted(range(n), key=lambda b: (-b_size[b], b))[:max(0, limit)]
    chosen.sort()
    tags_used: Dict[int, int] = {}
    sites_used: Dict[int, int] = {}
    rows = []
    for b in chosen:
        def at(ev: int) -> float:
            return round(ev_t[ev] - t0, 6) if axis_is_time else float(ev)
        end = at(b_free_ev[b]) if b_free_ev[b] >= 0 else None
        ti = tags_used.setdefault(b_tag[b], len(tags_used))
        si = sites_used.setdefault(b_site[b], len(sites_used)) if b_site[b] >= 0 else -1
        try:
            address: Optional[int] = int(b_ptr[b], 16)
        except ValueError:
            address = None
        rows.append([at(b_alloc_ev[b]), end, b_size[b], ti, si, address, b])
    return {
        "total": n,
        "shown": len(rows),
        "limit": limit,
        "smallest_shown": min((r[2] for r in rows), default=0),
        "tags": [tag_names[k] for k in tags_used],
        "sites": [site_names[k] for k in sites_used],
        "blocks": rows,
    }


def _held_json(counts, live, cached, pending, peak, at, t0) -> Dict[str, Any]:
    """What xlog held from the driver, rebuilt from reserve/release/retire
    rows: `known` is False for a log without them (RMM's, or an older
    xlog's), and the numbers are then left out."""
    known = any(counts.values())
    out: Dict[str, Any] = {"known": known, "counts": dict(counts)}
    if known:
        out["at_end"] = {"live": live, "cached": cached, "pending": pending, "held": live + cached + pending}
        out["peak"] = {"bytes": max(peak, 0), "t": at.get("t", t0) - t0, "clock": at.get("clock", ""),
                       "live": at.get("live", 0), "cached": at.get("cached", 0), "pending": at.get("pending", 0)}
    return out


def _end_block(block, t, b_size, b_tag, b_stream, b_free_ev, ev_t, ev_delta, ev_tag, ev_stream, tag_live,
               stream_live) -> None:
    size = b_size[block]
    ti = b_tag[block]
    si = b_stream[block]
    b_free_ev[block] = len(ev_t)
    ev_t.append(t)
    ev_delta.append(-size)
    ev_tag.append(ti)
    ev_stream.append(si)
    tag_live[ti] -= size
    stream_live[si] -= size


def _clock_text(t: float) -> str:
    t = t % 86400.0
    h = int(t // 3600)
    m = int(t // 60 % 60)
    return f"{h:02d}:{m:02d}:{t % 60:09.6f}"


def _block_json(b, b_size, b_tag, b_stream, b_t, b_line, b_ptr, tag_names, stream_names, now, t0):
    return {"ptr": b_ptr[b], "size": b_size[b], "tag": tag_names[b_tag[b]], "stream": stream_names[b_stream[b]],
            "allocated_at": round(b_t[b] - t0, 6), "age": round(now - b_t[b], 6), "line": b_line[b]}


def _resample(ev_t, ev_delta, ev_tag, ev_stream, tag_slot, stream_slot, n_tag, n_stream, points, t0, t1):
    """Live bytes per named tag and stream at `points` moments: in each of
    `points` equal intervals of time, the moment of the largest total (so
    the envelope keeps every peak), plus the smallest total of the
    interval. Intervals without an event repeat the state before them."""
    n = len(ev_t)
    if n == 0:
        return {"t": [], "total": [], "total_min": [], "by_tag": [[] for _ in range(n_tag)],
                "by_stream": [[] for _ in range(n_stream)], "axis": "time"}
    span = t1 - t0
    axis = "time"
    if span <= 0:
        # No usable clock (one timestamp for everything): use event order.
        axis = "event"
        span = float(max(n - 1, 1))
    scale = (points - 1) / span
    tag_now = [0] * n_tag
    stream_now = [0] * n_stream
    out_t: List[float] = []
    out_total: List[int] = []
    out_min: List[int] = []
    out_tag: List[List[int]] = [[] for _ in range(n_tag)]
    out_stream: List[List[int]] = [[] for _ in range(n_stream)]
    total = 0
    bucket = -1
    best = -1
    worst = 0
    best_tag: List[int] = []
    best_stream: List[int] = []
    best_t = 0.0

    def flush(upto: int) -> None:
        # Emit the current bucket, then carry its end state into empty ones.
        out_t.append(round(best_t, 6))
        out_total.append(best)
        out_min.append(worst)
        for k in range(n_tag):
            out_tag[k].append(best_tag[k])
        for k in range(n_stream):
            out_stream[k].append(best_stream[k])
        for empty in range(bucket + 1, upto):
            out_t.append(round(empty / scale, 6))
            out_total.append(total)
            out_min.append(total)
            for k in range(n_tag):
                out_tag[k].append(tag_now[k])
            for k in range(n_stream):
                out_stream[k].append(stream_now[k])

    for i in range(n):
        x = (ev_t[i] - t0) if axis == "time" else float(i)
        # Rows of several writers interleave by batch, not in time order,
        # and a hand-edited time may be anywhere: an event before the
        # current interval counts in it, one past the end in the last one.
        at = x * scale
        b = points - 1 if at >= points - 1 else (int(at) if at > 0 else 0)
        b = max(b, bucket)
        if b != bucket:
            if bucket >= 0:
                flush(b)
            bucket = b
            best = -1
            worst = total
        d = ev_delta[i]
        total += d
        tag_now[tag_slot[ev_tag[i]]] += d
        stream_now[stream_slot[ev_stream[i]]] += d
        if total > best:
            best = total
            best_tag = tag_now[:]
            best_stream = stream_now[:]
            best_t = x
        if total < worst:
            worst = total
    flush(bucket + 1)
    return {"t": out_t, "total": out_total, "total_min": out_min, "by_tag": out_tag, "by_stream": out_stream,
            "axis": axis}


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<script>
/* First: every error on this page is counted in <html data-errors>, so a
   test (or a person) can tell a page that drew from one that broke. */
(function () {
  var n = 0, root = document.documentElement;
  function note(msg) { n += 1; root.setAttribute("data-errors", String(n)); root.setAttribute("data-last-error", String(msg).slice(0, 300)); }
  window.addEventListener("error", function (e) { note(e.message || e); });
  window.addEventListener("unhandledrejection", function (e) { note(e.reason); });
  var original = console.error;
  console.error = function () { note(Array.prototype.join.call(arguments, " ")); return original.apply(console, arguments); };
})();
</script>
<style>
:root { --fg: #1d2330; --muted: #5d6678; --line: #d9dee8; --bg: #ffffff; --panel: #f6f8fb; --accent: #c0392b; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 18px 28px 10px; border-bottom: 1px solid var(--line); }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 26px 0 8px; }
.sub { color: var(--muted); }
main { padding: 0 28px 40px; max-width: 1500px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0 6px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 150px; }
.card b { display: block; font-size: 18px; }
.card span { color: var(--muted); font-size: 12px; }
.card.warn b { color: var(--accent); }
.chart { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; position: relative; }
.chart svg { display: block; width: 100%; height: auto; }
.controls { margin: 6px 0; color: var(--muted); }
.controls label { margin-right: 14px; cursor: pointer; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 6px 2px; font-size: 12px; }
.legend i { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
.tip { position: absolute; pointer-events: none; background: rgba(29,35,48,.94); color: #fff; font-size: 12px; padding: 7px 9px; border-radius: 5px; display: none; white-space: nowrap; z-index: 2; }
.tip td { padding: 0 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px; }
th, td { text-align: left; padding: 3px 10px 3px 0; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0 10px; }
.empty { color: var(--muted); font-style: italic; }
td.stack { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; max-width: 760px; word-break: break-all; }
button { font: inherit; margin-right: 8px; }
.two { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 24px; }
@media (max-width: 1000px) { .two { grid-template-columns: minmax(0, 1fr); } }
code { font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <div class="sub" id="subtitle"></div>
</header>
<main>
  <div class="cards" id="cards"></div>
  <h2>Live bytes over time</h2>
  <div class="controls">stack by:
    <label><input type="radio" name="stack" value="tag" checked> tag</label>
    <label><input type="radio" name="stack" value="stream"> stream</label>
    <span id="axisnote"></span>
  </div>
  <div class="controls"><button id="unzoom" type="button" disabled>reset zoom</button>
    drag across a chart to zoom into a time range, double-click to see it all. <span id="zoomnote"></span></div>
  <div class="chart" id="timeline"></div>
  <div class="legend" id="legend"></div>
  <div class="note">Each point is the moment of the largest total in its interval of time, so no peak is lost; the dashed line is the smallest total of the interval. Live = allocated and not yet freed, as the log records them.</div>
  <h2>Blocks over time</h2>
  <div class="controls">y axis:
    <label><input type="radio" name="life" value="order" checked> allocation order</label>
    <label><input type="radio" name="life" value="address"> address</label>
  </div>
  <div class="chart" id="lifetimes"></div>
  <div class="note" id="lifenote"></div>
  <h2>Call stacks</h2>
  <div id="callsites"></div>
  <div class="two">
    <div>
      <h2>The peak: <span id="peaktitle"></span></h2>
      <div id="peakbytag"></div>
      <div id="peakblocks"></div>
    </div>
    <div>
      <h2>Allocation sizes</h2>
      <div class="controls">
        <label><input type="radio" name="hist" value="count" checked> number of allocations</label>
        <label><input type="radio" name="hist" value="bytes"> bytes</label>
      </div>
      <div class="chart" id="histogram"></div>
      <h2>Leaks</h2>
      <div id="leaks"></div>
      <h2>Refusals</h2>
      <div id="refusals"></div>
    </div>
  </div>
  <h2>Tags</h2>
  <div id="tags"></div>
  <h2>Streams</h2>
  <div id="streams"></div>
  <h2>About this log</h2>
  <div id="about"></div>
</main>
<script id="report-data" type="application/json">__DATA__</script>
<script>
"use strict";
(function () {
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var SVG = "http://www.w3.org/2000/svg";
  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#86bcb6", "#bab0ac"];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function bytes(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = Number(n);
    if (!isFinite(v)) return "?";
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + " " + units[i];
  }
  function num(n) { return Number(n).toLocaleString("en-US"); }
  function secs(s) {
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
    if (s < 120) return s.toFixed(s < 10 ? 3 : 1) + " s";
    return (s / 60).toFixed(1) + " min";
  }
  function color(i, n, label) { return label === "(other)" ? "#bab0ac" : PALETTE[i % (PALETTE.length - 1)]; }
  function card(label, value, warn) {
    var c = el("div", { "class": "card" + (warn ? " warn" : "") });
    c.appendChild(el("b", null, value));
    c.appendChild(el("span", null, label));
    document.getElementById("cards").appendChild(c);
  }
  function tableOf(columns, rows, emptyText, rowTitle) {
    if (!rows.length) return el("div", { "class": "empty" }, emptyText);
    var t = el("table"), head = el("tr");
    columns.forEach(function (c) { head.appendChild(el("th", c.n ? { "class": "n" } : null, c.title)); });
    t.appendChild(head);
    rows.forEach(function (r) {
      var tr = el("tr");
      var hover = rowTitle ? rowTitle(r) : "";
      if (hover) tr.setAttribute("title", hover);
      columns.forEach(function (c) {
        var td = el("td", c.n ? { "class": "n" } : (c.cls ? { "class": c.cls } : null));
        if (c.lines) c.lines(r).forEach(function (text, k) { if (k) td.appendChild(el("br")); td.appendChild(document.createTextNode(text)); });
        else td.textContent = String(c.get(r));
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    return t;
  }

  // ---- header and summary cards ----
  document.title = "xlog memory report: " + D.source_name;
  document.getElementById("title").textContent = "xlog memory report: " + D.source_name;
  document.getElementById("subtitle").textContent = num(D.lines) + " lines, " + num(D.events) +
    " events over " + secs(D.duration_s) + (D.first_clock ? " (" + D.first_clock + " to " + D.last_clock + ")" : "") +
    ", " + D.threads + " thread(s). Generated " + D.generated + " from " + D.source + ".";
  card("peak live", bytes(D.peak.bytes));
  card("allocations", num(D.counts.allocate));
  card("frees", num(D.counts.free));
  // A card never reads "0 B in 0": an empty quantity says so in words.
  card("live at the end of the log", D.live_at_end.blocks ? bytes(D.live_at_end.bytes) + " in " + num(D.live_at_end.blocks) +
    (D.live_at_end.blocks === 1 ? " block" : " blocks") : "nothing", D.live_at_end.blocks > 0);
  card("refusals", D.refusals.count ? num(D.refusals.count) : "none", D.refusals.count > 0);
  card("leaked blocks", D.leaks.blocks ? num(D.leaks.blocks) + " (" + bytes(D.leaks.bytes) + ")" : "none", D.leaks.blocks > 0);
  if (D.held && D.held.known) {
    var hp = D.held.peak, he = D.held.at_end;
    card("peak held from the driver", bytes(hp.bytes) + " at " + (hp.clock || secs(hp.t)) + ": " +
      ["live", "cached", "pending"].filter(function (k) { return hp[k]; }).map(function (k) { return k + " " + bytes(hp[k]); }).join(", "));
    card("held at the end of the log", he.held ? ["live", "cached", "pending"].filter(function (k) { return he[k]; })
      .map(function (k) { return k + " " + bytes(he[k]); }).join(", ") : "nothing", he.held > 0);
  }

  // ---- the timeline: zoomable (drag across it to select a time range,
  // double-click or "reset zoom" to see it all again) ----
  var tip = el("div", { "class": "tip" });
  document.getElementById("timeline").appendChild(tip);
  var W = 1200, H = 390, M = { l: 78, r: 16, t: 28, b: 34 };
  var XMAX = D.series.t.length ? Math.max(D.series.t[D.series.t.length - 1], 1e-9) : 1;
  // The view: [VX0, VX1] on the axis (seconds, or event numbers), shared
  // by the timeline and the per-block view.
  var VX0 = 0, VX1 = XMAX, stackMode = "tag", zooms = 0;
  function axisLabel(v) { return D.series.axis === "time" ? secs(v) : "event " + num(Math.round(v)); }
  function xScale(pw) { return function (v) { return M.l + pw * (v - VX0) / Math.max(VX1 - VX0, 1e-12); }; }
  function xTicks(s, X, y, h) {
    for (var gx = 0; gx <= 6; gx++) {
      var xv = VX0 + (VX1 - VX0) * gx / 6, x = X(xv);
      var tl = svg("text", { x: x, y: y, "text-anchor": gx === 0 ? "start" : gx === 6 ? "end" : "middle", "font-size": 11, fill: "#5d6678" });
      tl.textContent = axisLabel(xv); s.appendChild(tl);
    }
  }
  // Dragging across `hit` (a rect over the plot of `s`, whose width in
  // viewBox units is `w`) selects [a, b]; a double-click resets.
  function brush(s, hit, w, pw, top, height) {
    var band = svg("rect", { x: 0, y: top, width: 0, height: height, fill: "#4e79a7", "fill-opacity": 0.18, stroke: "#4e79a7", "stroke-opacity": 0.6, display: "none", "pointer-events": "none" });
    s.appendChild(band);
    var from = null;
    function fx(ev) { var r = s.getBoundingClientRect(); return Math.max(M.l, Math.min(M.l + pw, (ev.clientX - r.left) / r.width * w)); }
    hit.addEventListener("mousedown", function (ev) { from = fx(ev); band.setAttribute("x", from); band.setAttribute("width", 0); band.setAttribute("display", "inline"); ev.preventDefault(); });
    hit.addEventListener("mousemove", function (ev) {
      if (from === null) return;
      var x = fx(ev); band.setAttribute("x", Math.min(from, x)); band.setAttribute("width", Math.abs(x - from));
    });
    function end(ev) {
      if (from === null) return;
      var x = fx(ev), a = Math.min(from, x), b = Math.max(from, x); from = null; band.setAttribute("display", "none");
      if (b - a < 4) return;  // a click, not a drag
      var span = VX1 - VX0, na = VX0 + span * (a - M.l) / pw, nb = VX0 + span * (b - M.l) / pw;
      zoomTo(na, nb);
    }
    hit.addEventListener("mouseup", end);
    hit.addEventListener("mouseleave", function (ev) { if (from !== null) end(ev); });
    hit.addEventListener("dblclick", function () { zoomTo(0, XMAX); });
  }
  function zoomTo(a, b) {
    VX0 = Math.max(0, a); VX1 = Math.min(XMAX, Math.max(b, VX0 + XMAX * 1e-6));
    if (a <= 0 && b >= XMAX) { VX0 = 0; VX1 = XMAX; }
    zooms += 1;
    drawTimeline(stackMode);
    document.documentElement.setAttribute("data-blocks", String(drawLifetimes(lifeMode)));
    var zoomed = VX0 > 0 || VX1 < XMAX;
    document.getElementById("zoomnote").textContent = zoomed ? "showing " + axisLabel(VX0) + " to " + axisLabel(VX1) + " of " + axisLabel(XMAX) : "";
    document.getElementById("unzoom").disabled = !zoomed;
    document.documentElement.setAttribute("data-zoom", VX0.toFixed(9) + "," + VX1.toFixed(9));
  }
  function drawTimeline(mode) {
    stackMode = mode;
    var box = document.getElementById("timeline");
    var old = box.querySelector("svg"); if (old) box.removeChild(old);
    var labels = mode === "tag" ? D.tag_labels : D.stream_labels;
    if (mode === "stream") labels = labels.map(function (s) { return s === "(other)" ? s : "stream " + s; });
    var values = mode === "tag" ? D.series.by_tag : D.series.by_stream;
    var t = D.series.t, n = t.length;
    var s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "live bytes over time" });
    box.insertBefore(s, tip);
    var legend = document.getElementById("legend"); legend.textContent = "";
    if (!n) { var e = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#5d6678" }); e.textContent = "no allocations in this log"; s.appendChild(e); return 0; }
    var pw = W - M.l - M.r, ph = H - M.t - M.b;
    // The points in view, and one on each side so the areas reach the edges.
    var i0 = 0, i1 = n - 1;
    while (i0 < n - 1 && t[i0 + 1] < VX0) i0++;
    while (i1 > 0 && t[i1 - 1] > VX1) i1--;
    var ymax = 1;
    for (var q = i0; q <= i1; q++) if (D.series.total[q] > ymax) ymax = D.series.total[q];
    var X = xScale(pw);
    function Y(v) { return M.t + ph * (1 - v / ymax); }
    var clipId = "clip-timeline";
    var defs = svg("defs", {}), cp = svg("clipPath", { id: clipId });
    cp.appendChild(svg("rect", { x: M.l, y: 0, width: pw, height: H - M.b })); defs.appendChild(cp); s.appendChild(defs);
    for (var g = 0; g <= 4; g++) {
      var yv = ymax * g / 4, y = Y(yv);
      s.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: y, y2: y, stroke: "#e6e9ef" }));
      var lab = svg("text", { x: M.l - 8, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#5d6678" }); lab.textContent = bytes(yv); s.appendChild(lab);
    }
    xTicks(s, X, H - 12);
    var plot = svg("g", { "clip-path": "url(#" + clipId + ")" }); s.appendChild(plot);
    // stacked areas, bottom series first
    var base = [], drawn = 0;
    for (var b0 = i0; b0 <= i1; b0++) base.push(0);
    values.forEach(function (vals, k) {
      var top = [], up = "", down = "";
      for (var i = i0; i <= i1; i++) top.push(base[i - i0] + vals[i]);
      for (var i2 = i0; i2 <= i1; i2++) up += (i2 > i0 ? "L" : "M") + X(t[i2]).toFixed(1) + "," + Y(top[i2 - i0]).toFixed(1);
      for (var j = i1; j >= i0; j--) down += "L" + X(t[j]).toFixed(1) + "," + Y(base[j - i0]).toFixed(1);
      var c = color(k, values.length, labels[k]);
      plot.appendChild(svg("path", { d: up + down + "Z", fill: c, "fill-opacity": 0.85, stroke: c, "stroke-width": 0.6, "data-series": labels[k] }));
      base = top; drawn += 1;
      var item = el("span"); var sw = el("i"); sw.style.background = c; item.appendChild(sw); item.appendChild(document.createTextNode(labels[k])); legend.appendChild(item);
    });
    var minPath = "";
    for (var m = i0; m <= i1; m++) minPath += (m > i0 ? "L" : "M") + X(t[m]).toFixed(1) + "," + Y(D.series.total_min[m]).toFixed(1);
    plot.appendChild(svg("path", { d: minPath, fill: "none", stroke: "#1d2330", "stroke-width": 1, "stroke-dasharray": "4 3", "stroke-opacity": 0.6 }));
    // the peak (when in view); its label sits in the top margin, above the
    // plot: never over the areas
    var pv = D.series.axis === "time" ? D.peak.t : D.peak.event;
    if (pv >= VX0 && pv <= VX1) {
      var px = X(pv);
      s.appendChild(svg("line", { x1: px, x2: px, y1: M.t, y2: H - M.b, stroke: "#c0392b", "stroke-width": 1.2, "stroke-dasharray": "5 3" }));
      var pl = svg("text", { x: Math.max(M.l, Math.min(px, W - M.r)), y: M.t - 9, "font-size": 12, fill: "#c0392b",
        "text-anchor": px > W - 220 ? "end" : px < M.l + 220 ? "start" : "middle", "data-role": "peak-label" });
      pl.textContent = "peak " + bytes(D.peak.bytes) + " at " + secs(D.peak.t); s.appendChild(pl);
    }
    s.appendChild(svg("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, stroke: "#9aa3b2" }));
    s.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#9aa3b2" }));
    // hover: the stack at the nearest point
    var cursor = svg("line", { x1: 0, x2: 0, y1: M.t, y2: H - M.b, stroke: "#1d2330", "stroke-opacity": 0, "stroke-width": 1 });
    s.appendChild(cursor);
    var hit = svg("rect", { x: M.l, y: M.t, width: pw, height: ph, fill: "transparent", cursor: "crosshair", "data-role": "brush" });
    s.appendChild(hit);
    brush(s, hit, W, pw, M.t, ph);
    hit.addEventListener("mousemove", function (ev) {
      var r = s.getBoundingClientRect(), fx = (ev.clientX - r.left) / r.width * W;
      var v = VX0 + (fx - M.l) / pw * (VX1 - VX0), lo = 0, hi = n - 1;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (t[mid] < v) lo = mid + 1; else hi = mid; }
      var i = lo; cursor.setAttribute("x1", X(t[i])); cursor.setAttribute("x2", X(t[i])); cursor.setAttribute("stroke-opacity", 0.5);
      tip.textContent = "";
      var tb = el("table"), head = el("tr");
      head.appendChild(el("td", null, axisLabel(t[i])));
      head.appendChild(el("td", { "class": "n" }, bytes(D.series.total[i]))); tb.appendChild(head);
      for (var k = values.length - 1; k >= 0; k--) {
        if (!values[k][i]) continue;
        var tr = el("tr"); tr.appendChild(el("td", null, labels[k])); tr.appendChild(el("td", { "class": "n" }, bytes(values[k][i]))); tb.appendChild(tr);
      }
      tip.appendChild(tb); tip.style.display = "block";
      var bx = (ev.clientX - box.getBoundingClientRect().left);
      tip.style.left = Math.min(bx + 14, box.clientWidth - tip.offsetWidth - 4) + "px"; tip.style.top = "16px";
    });
    hit.addEventListener("mouseleave", function () { tip.style.display = "none"; cursor.setAttribute("stroke-opacity", 0); });
    return drawn;
  }

  // ---- the per-block view: each block's lifetime as a bar (time on x;
  // on y its allocation order packed into lanes, or its address) ----
  var lifeMode = "order", LH = 340;
  function drawLifetimes(mode) {
    lifeMode = mode;
    var box = document.getElementById("lifetimes"), Lf = D.lifetimes;
    box.textContent = "";
    var s = svg("svg", { viewBox: "0 0 " + W + " " + LH, role: "img", "aria-label": "block lifetimes" });
    box.appendChild(s);
    var rows = Lf.blocks, n = rows.length;
    if (!n) { var e = svg("text", { x: W / 2, y: LH / 2, "text-anchor": "middle", fill: "#5d6678" }); e.textContent = "no allocations in this log"; s.appendChild(e); return 0; }
    var pw = W - M.l - M.r, ph = LH - M.t - M.b, X = xScale(pw);
    var defs = svg("defs", {}), cp = svg("clipPath", { id: "clip-lifetimes" });
    cp.appendChild(svg("rect", { x: M.l, y: 0, width: pw, height: LH })); defs.appendChild(cp); s.appendChild(defs);
    xTicks(s, X, LH - 12);
    var place = [], lanes = 1, lo = Infinity, hi = -Infinity, useAddress = mode === "address";
    if (useAddress) rows.forEach(function (r) { if (r[5] === null) useAddress = false; else { lo = Math.min(lo, r[5]); hi = Math.max(hi, r[5] + r[2]); } });
    if (!useAddress) {
      // Greedy lanes in allocation order: a block takes the first lane
      // free at its start (so order reads top to bottom, and few lanes).
      var laneEnd = [];
      rows.forEach(function (r) {
        var end = r[1] === null ? Infinity : r[1], k = 0;
        while (k < laneEnd.length && laneEnd[k] > r[0]) k++;
        laneEnd[k] = end; place.push(k);
      });
      lanes = laneEnd.length;
    }
    var laneH = ph / lanes;
    var plot = svg("g", { "clip-path": "url(#clip-lifetimes)" }); s.appendChild(plot);
    var drawn = 0;
    rows.forEach(function (r, i) {
      var end = r[1] === null ? XMAX : r[1];
      if (end < VX0 || r[0] > VX1) return;
      var x0 = X(r[0]), x1 = X(end), y, h;
      if (useAddress) { var span = Math.max(hi - lo, 1); y = M.t + ph * (r[5] - lo) / span; h = Math.max(ph * r[2] / span, 1); }
      else { y = M.t + place[i] * laneH; h = Math.max(laneH - (laneH > 3 ? 1 : 0), 0.8); }
      var tagName = Lf.tags[r[3]], site = r[4] >= 0 ? Lf.sites[r[4]] : "";
      // The timeline's colour for the tag (its "(other)" grey when unnamed there).
      var k = D.tag_labels.indexOf(tagName === "" ? "(no tag)" : tagName);
      var c = k < 0 ? color(0, 0, "(other)") : color(k, D.tag_labels.length, D.tag_labels[k]);
      var bar = svg("rect", { x: x0, y: y, width: Math.max(x1 - x0, 1), height: h, fill: c, "fill-opacity": r[1] === null ? 0.55 : 0.9, "data-block": r[6] });
      var title = svg("title", {});
      title.textContent = bytes(r[2]) + " (" + num(r[2]) + " bytes), tag " + (tagName || "(no tag)") + "\n" +
        axisLabel(r[0]) + " to " + (r[1] === null ? "the end of the log (never freed)" : axisLabel(r[1])) +
        (r[5] !== null ? "\naddress 0x" + r[5].toString(16) : "") + (site ? "\ncall site: " + site.split(" <- ").join("\n  <- ") : "");
      bar.appendChild(title); plot.appendChild(bar); drawn += 1;
    });
    var pv = D.series.axis === "time" ? D.peak.t : D.peak.event;
    if (pv >= VX0 && pv <= VX1) s.appendChild(svg("line", { x1: X(pv), x2: X(pv), y1: M.t, y2: LH - M.b, stroke: "#c0392b", "stroke-width": 1.2, "stroke-dasharray": "5 3", "pointer-events": "none" }));
    var yl = svg("text", { x: M.l - 8, y: M.t + 10, "text-anchor": "end", "font-size": 11, fill: "#5d6678" });
    yl.textContent = useAddress ? "0x" + lo.toString(16) : "first"; s.appendChild(yl);
    var yl2 = svg("text", { x: M.l - 8, y: LH - M.b, "text-anchor": "end", "font-size": 11, fill: "#5d6678" });
    yl2.textContent = useAddress ? "0x" + hi.toString(16) : lanes + " lanes"; s.appendChild(yl2);
    s.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: LH - M.b, y2: LH - M.b, stroke: "#9aa3b2" }));
    // The brush lies under the bars' hover titles: drag on empty space.
    var hit = svg("rect", { x: M.l, y: M.t, width: pw, height: ph, fill: "transparent", cursor: "crosshair" });
    s.insertBefore(hit, plot);
    brush(s, hit, W, pw, M.t, ph);
    plot.addEventListener("dblclick", function () { zoomTo(0, XMAX); });
    document.getElementById("lifenote").textContent = (Lf.shown < Lf.total
      ? "The " + num(Lf.shown) + " largest of " + num(Lf.total) + " blocks (" + bytes(Lf.smallest_shown) + " and up; --blocks N draws more)"
      : "All " + num(Lf.total) + " blocks") + ", " + (useAddress ? "by address (bar height: the block's size)" :
      "in allocation order, packed into lanes") + "; colour = tag; paler = never freed in the log; hover a bar for its size, lifetime" +
      (D.call_sites.known ? " and call site" : "") + ".";
    return drawn;
  }

  // ---- the histogram ----
  function drawHistogram(mode) {
    var box = document.getElementById("histogram");
    box.textContent = "";
    var h = D.histogram, w = 600, hh = 240, m = { l: 70, r: 10, t: 10, b: 54 };
    var s = svg("svg", { viewBox: "0 0 " + w + " " + hh, role: "img", "aria-label": "allocation sizes" });
    box.appendChild(s);
    if (!h.length) { var e = svg("text", { x: w / 2, y: hh / 2, "text-anchor": "middle", fill: "#5d6678" }); e.textContent = "no allocations"; s.appendChild(e); return 0; }
    var key = mode === "bytes" ? "bytes" : "count";
    var ymax = Math.max.apply(null, h.map(function (b) { return b[key]; })) || 1;
    var bw = (w - m.l - m.r) / h.length;
    for (var g = 0; g <= 4; g++) {
      var y = m.t + (hh - m.t - m.b) * (1 - g / 4);
      s.appendChild(svg("line", { x1: m.l, x2: w - m.r, y1: y, y2: y, stroke: "#e6e9ef" }));
      var l = svg("text", { x: m.l - 6, y: y + 4, "text-anchor": "end", "font-size": 10, fill: "#5d6678" });
      l.textContent = key === "bytes" ? bytes(ymax * g / 4) : num(Math.round(ymax * g / 4)); s.appendChild(l);
    }
    h.forEach(function (b, i) {
      var bh = (hh - m.t - m.b) * b[key] / ymax, x = m.l + i * bw;
      var r = svg("rect", { x: x + 1, y: hh - m.b - bh, width: Math.max(bw - 2, 1), height: bh, fill: "#4e79a7" });
      var title = svg("title", {}); title.textContent = (b.hi ? bytes(b.lo) + " to " + bytes(b.hi + 1) : "0 bytes") + ": " + num(b.count) + " allocations, " + bytes(b.bytes);
      r.appendChild(title); s.appendChild(r);
      var l = svg("text", { x: x + bw / 2, y: hh - m.b + 12, "text-anchor": "end", "font-size": 10, fill: "#5d6678", transform: "rotate(-40 " + (x + bw / 2) + " " + (hh - m.b + 12) + ")" });
      l.textContent = b.hi ? "≥" + bytes(b.lo) : "0 B"; s.appendChild(l);
    });
    return h.length;
  }

  var drawnSeries = drawTimeline("tag");
  var drawnBlocks = drawLifetimes("order");
  Array.prototype.forEach.call(document.querySelectorAll("input[name=life]"), function (r) {
    r.addEventListener("change", function () { drawLifetimes(r.value); });
  });
  document.getElementById("unzoom").addEventListener("click", function () { zoomTo(0, XMAX); });
  var bars = drawHistogram("count");
  Array.prototype.forEach.call(document.querySelectorAll("input[name=stack]"), function (r) {
    r.addEventListener("change", function () { drawTimeline(r.value); });
  });
  Array.prototype.forEach.call(document.querySelectorAll("input[name=hist]"), function (r) {
    r.addEventListener("change", function () { drawHistogram(r.value); });
  });
  document.getElementById("axisnote").textContent = D.series.axis === "time"
    ? "x: seconds since the first event" : "x: event number (the log's times do not advance)";

  // ---- the peak ----
  document.getElementById("peaktitle").textContent = bytes(D.peak.bytes) + " at " + secs(D.peak.t) +
    (D.peak.clock ? " (" + D.peak.clock + ")" : "") + ", " + num(D.peak.blocks) + " blocks live";
  document.getElementById("peakbytag").appendChild(tableOf(
    [{ title: "tag", get: function (r) { return r[0] || "(no tag)"; } }, { title: "blocks", n: 1, get: function (r) { return num(r[1]); } },
     { title: "bytes", n: 1, get: function (r) { return bytes(r[2]); } }, { title: "share", n: 1, get: function (r) { return (100 * r[2] / Math.max(D.peak.bytes, 1)).toFixed(1) + "%"; } }],
    D.peak.by_tag, "nothing was live"));
  var blockCols = [
    { title: "size", n: 1, get: function (r) { return bytes(r.size); } }, { title: "bytes", n: 1, get: function (r) { return num(r.size); } },
    { title: "tag", get: function (r) { return r.tag || "(no tag)"; } }, { title: "stream", get: function (r) { return r.stream; } },
    { title: "age", n: 1, get: function (r) { return secs(r.age); } }, { title: "pointer", get: function (r) { return r.ptr; } },
    { title: "line", n: 1, get: function (r) { return num(r.line); } }];
  function siteOf(r) { return r.site ? "call site: " + r.site.split(" <- ").join("\n  <- ") : ""; }
  if (D.call_sites.known) blockCols.push({ title: "call site", get: function (r) { var f = (r.site || "").split(" <- ")[0]; return f || "(none)"; } });

  // ---- call stacks: the blocks live at the peak (and at the end) grouped
  // by the call site the log's allocate rows carry ----
  var cs = document.getElementById("callsites"), C = D.call_sites;
  if (!C.known) {
    cs.appendChild(el("div", { "class": "note" }, "This log carries no call sites. Run with XLOG_TRACK_CALLSITES=1 (or track_call_sites=True) and the log's allocate rows name each allocation's call site in Detail; the report then groups the blocks live at the peak by call stack here."));
  } else {
    var stackCols = function (what) {
      return [{ title: "call stack (innermost first)", cls: "stack", lines: function (r) { return r.stack ? r.stack.split(" <- ") : ["(no call site)"]; } },
        { title: "blocks", n: 1, get: function (r) { return num(r.blocks); } },
        { title: what, n: 1, get: function (r) { return bytes(r.bytes); } },
        { title: "share", n: 1, get: function (r) { return (100 * r.bytes / Math.max(what === "bytes at peak" ? D.peak.bytes : D.live_at_end.bytes, 1)).toFixed(1) + "%"; } }];
    };
    cs.appendChild(el("div", { "class": "note" }, num(C.sites) + " call site(s); " + num(C.allocations_with_site) + " of " + num(C.allocations) + " allocations name one. The blocks live at the peak (" + bytes(D.peak.bytes) + "), by call stack:"));
    var st = tableOf(stackCols("bytes at peak"), C.at_peak, "nothing was live at the peak");
    st.setAttribute("id", "sites-at-peak"); cs.appendChild(st);
    if (C.at_end.length) {
      cs.appendChild(el("div", { "class": "note" }, "Live at the end of the log, by call stack:"));
      cs.appendChild(tableOf(stackCols("bytes at end"), C.at_end, ""));
    }
  }
  var pb = document.getElementById("peakblocks");
  pb.appendChild(el("div", { "class": "note" }, "Blocks live at the peak, largest first" + (D.peak.blocks > D.peak.listed.length ? " (the " + D.peak.listed.length + " largest of " + num(D.peak.blocks) + ")" : "") + "; age = time since its allocation."));
  pb.appendChild(tableOf(blockCols, D.peak.listed, "nothing was live", siteOf));

  // ---- leaks ----
  var lk = document.getElementById("leaks"), L = D.leaks;
  lk.appendChild(el("div", { "class": "note" }, num(L.blocks) + " leaked block(s), " + bytes(L.bytes) + ": " +
    num(L.never_freed) + " allocated in this log and never freed in it (" + bytes(L.never_freed_bytes) + "), and " +
    num(L.reported_rows) + " leak row(s) the runtime wrote at close for blocks still live then (it frees them itself)."));
  if (L.by_tag.length) lk.appendChild(tableOf([{ title: "tag", get: function (r) { return r[0] || "(no tag)"; } }, { title: "blocks", n: 1, get: function (r) { return num(r[1]); } }, { title: "bytes", n: 1, get: function (r) { return bytes(r[2]); } }], L.by_tag, ""));
  lk.appendChild(tableOf(blockCols.concat([{ title: "leak row", get: function (r) { return r.reported ? "yes" : ""; } }]), L.listed, "no leaks: every allocation in the log was freed by its owner", siteOf));
  if (L.reported_not_allocated_in_log.length) {
    lk.appendChild(el("div", { "class": "note" }, "Leak rows for blocks allocated before the log started:"));
    lk.appendChild(tableOf([{ title: "size", n: 1, get: function (r) { return bytes(r.size); } }, { title: "tag", get: function (r) { return r.tag; } }, { title: "stream", get: function (r) { return r.stream; } }, { title: "pointer", get: function (r) { return r.ptr; } }, { title: "line", n: 1, get: function (r) { return num(r.line); } }], L.reported_not_allocated_in_log, ""));
  }

  // ---- refusals ----
  var rf = document.getElementById("refusals");
  rf.appendChild(el("div", { "class": "note" }, num(D.refusals.count) + " refused allocation(s), " + bytes(D.refusals.bytes) + " asked for."));
  rf.appendChild(tableOf([
    { title: "when", get: function (r) { return r.clock || secs(r.t); } }, { title: "size", n: 1, get: function (r) { return bytes(r.size); } },
    { title: "tag", get: function (r) { return r.tag; } }, { title: "stream", get: function (r) { return r.stream; } },
    { title: "action", get: function (r) { return r.action; } }, { title: "message", get: function (r) { return r.message || "(the row carries no message)"; } },
    { title: "line", n: 1, get: function (r) { return num(r.line); } }], D.refusals.listed, "no refusals"));

  // ---- tags and streams ----
  function summary(kind, rows, fmt) {
    return tableOf([{ title: kind, get: fmt }, { title: "allocations", n: 1, get: function (r) { return num(r.allocations); } },
      { title: "bytes allocated", n: 1, get: function (r) { return bytes(r.bytes_allocated); } }, { title: "peak live", n: 1, get: function (r) { return bytes(r.peak_live); } },
      { title: "live at end", n: 1, get: function (r) { return bytes(r.live_at_end); } }], rows, "none");
  }
  document.getElementById("tags").appendChild(summary("tag", D.tags.slice(0, 100), function (r) { return r.tag || "(no tag)"; }));
  document.getElementById("streams").appendChild(summary("stream", D.streams.slice(0, 100), function (r) { return r.stream; }));

  // ---- the rows not used ----
  var ab = document.getElementById("about");
  var other = Object.keys(D.other_actions);
  ab.appendChild(el("div", { "class": "note" }, "Columns: " + D.header.join(", ") + ". Read in " + D.seconds_to_read + " s."));
  ab.appendChild(el("div", { "class": "note" }, other.length ? "Other actions, counted but not events of live memory: " +
    other.map(function (k) { return k + " × " + num(D.other_actions[k]); }).join(", ") : "No other actions."));
  if (D.unmatched_frees.count) ab.appendChild(el("div", { "class": "note" }, num(D.unmatched_frees.count) + " free(s) of pointers the log never allocated (" + bytes(D.unmatched_frees.bytes) + "): the log started after those allocations."));
  if (D.reused_live_pointers) ab.appendChild(el("div", { "class": "note" }, num(D.reused_live_pointers) + " allocation(s) of a pointer already live: the earlier block was taken as freed there."));
  if (D.bad_rows.count) {
    ab.appendChild(el("div", { "class": "note" }, num(D.bad_rows.count) + " row(s) could not be read; the first:"));
    ab.appendChild(tableOf([{ title: "line", n: 1, get: function (r) { return r.line; } }, { title: "why", get: function (r) { return r.why; } }, { title: "row", get: function (r) { return r.row; } }], D.bad_rows.first, ""));
  }

  // A marker for tests: what got drawn.
  var root = document.documentElement;
  root.setAttribute("data-series", String(drawnSeries));
  root.setAttribute("data-bars", String(bars));
  root.setAttribute("data-points", String(D.series.t.length));
  root.setAttribute("data-blocks", String(drawnBlocks));
  root.setAttribute("data-sites", String(D.call_sites.known ? D.call_sites.at_peak.length : 0));
  root.setAttribute("data-report", "drawn");
})();
</script>
</body>
</html>
"""


_PLACEHOLDERS = re.compile("__TITLE__|__DATA__")


def render_html(data: Dict[str, Any], title: Optional[str] = None) -> str:
    """The report page for `analyze`'s data: one self-contained file."""
    data = dict(data)
    data.setdefault("generated", _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    # Inside <script>: no "</" may close it, whatever a tag contains.
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    page_title = title or f"xlog memory report: {data.get('source_name', '')}"
    # One pass over the page: text filled in (a title or file name that
    # says "__DATA__") is never scanned for placeholders again.
    fills = {"__TITLE__": html.escape(page_title), "__DATA__": payload}
    return _PLACEHOLDERS.sub(lambda m: fills[m.group(0)], _PAGE)


def render_png(data: Dict[str, Any], path: str) -> None:
    """A static picture of the report (timeline by tag and size histogram)
    with matplotlib. Raises ReportError when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ReportError(
            f"--png needs matplotlib, which is not installed for {sys.executable} ({e}). "
            "Install it (python -m pip install matplotlib) or leave --png out: the HTML report needs nothing."
        ) from e
    s = data["series"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [2.3, 1]})
    gib = 1 << 20
    if s["t"]:
        ax.stackplot(s["t"], [[v / gib for v in vals] for vals in s["by_tag"]], labels=data["tag_labels"], alpha=0.85)
        ax.plot(s["t"], [v / gib for v in s["total_min"]], "k--", linewidth=0.8, alpha=0.6)
        peak_x = data["peak"]["t"] if s["axis"] == "time" else data["peak"]["event"]
        ax.axvline(peak_x, color="#c0392b", linestyle="--", linewidth=1)
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.set_xlabel("seconds since the first event" if s["axis"] == "time" else "event")
    ax.set_ylabel("live MiB")
    ax.set_title(f"{data.get('source_name', '')}: live bytes by tag (peak {data['peak']['bytes'] / gib:.1f} MiB)")
    h = data["histogram"]
    bx.bar(range(len(h)), [b["count"] for b in h], color="#4e79a7")
    bx.set_xticks(range(len(h)))
    bx.set_xticklabels([_short_bytes(b["lo"]) if b["hi"] else "0" for b in h], rotation=60, fontsize=7)
    bx.set_title("allocation sizes (powers of two)")
    bx.set_ylabel("allocations")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short_bytes(n: int) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}P"


def write_report(log: str, html_path: str, png_path: Optional[str] = None, points: int = DEFAULT_POINTS,
                 top: int = DEFAULT_TOP, title: Optional[str] = None, blocks: int = DEFAULT_BLOCKS) -> Dict[str, Any]:
    """Analyze `log`, write the HTML page (and the PNG); return the data."""
    if png_path:  # fail before the work when --png cannot be honoured
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            render_png({}, png_path)  # raises ReportError with the explanation
    data = analyze(log, points=points, top=top, blocks=blocks)
    page = render_html(data, title)
    tmp = html_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, html_path)
    if png_path:
        render_png(data, png_path)
    return data


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m xlog_cuda.report",
        description="Turn an xlog CSV log (XLOG_LOG_PATH) into one self-contained HTML memory report.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The log's columns are found by name, in any order (Action, Pointer and Size are required):\n"
            f"  xlog writes 10 columns: {XLOG_COLUMNS}\n"
            f"  RMM's logging adaptor writes 6 columns: {RMM_COLUMNS}\n"
            "With call-site tracking (XLOG_TRACK_CALLSITES=1) Detail holds each allocation's call site,\n"
            "and the report groups the blocks live at the peak by call stack."
        ),
    )
    ap.add_argument("log", help="the CSV log: xlog's 10 columns or RMM's 6 (listed below)")
    ap.add_argument("-o", "--output", help="the HTML file to write (default: LOG with .html)")
    ap.add_argument("--png", help="also write a PNG picture (needs matplotlib)")
    ap.add_argument("--points", type=int, default=DEFAULT_POINTS, help=f"time-series samples (default {DEFAULT_POINTS})")
    ap.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"tags/streams named in the chart (default {DEFAULT_TOP})")
    ap.add_argument("--title", help="the page's title")
    ap.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS,
                    help=f"the largest blocks drawn in the per-block lifetime view (default {DEFAULT_BLOCKS})")
    args = ap.parse_args(argv)
    out = args.output or os.path.splitext(args.log)[0] + ".html"
    started = time.perf_counter()
    try:
        data = write_report(args.log, out, args.png, points=args.points, top=args.top, title=args.title, blocks=args.blocks)
    except ReportError as e:
        print(f"xlog_cuda.report: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - started
    print(
        f"{out}: {data['lines']:,} lines, {data['counts']['allocate']:,} allocations, peak {data['peak']['bytes']:,} bytes "
        f"at {data['peak']['t']:.6f} s, {data['leaks']['blocks']:,} leaked blocks, {data['refusals']['count']:,} "
        f"refusals ({took:.2f} s)" + (f"; picture {args.png}" if args.png else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

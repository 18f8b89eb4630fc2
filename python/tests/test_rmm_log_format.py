"""The first six columns of xlog's CSV log are RMM's logging adaptor format
(issue 14, item 5), checked with a parser written here from RMM's own:
`rmm::detail::parse_csv` in RMM's cpp/benchmarks/utilities/log_parser.hpp,
which its replay benchmark uses, over the rapidcsv reader it bundles. The
rules below are those of that code, restated (RMM's source was read, not
copied, and is not built here: it needs CUDA and RMM's headers):

- rapidcsv, default parameters: ',' separates, '"' quotes (a quoted cell
  may hold ','; '""' is a quote; the quotes are removed), no trimming, rows
  end at '\\n' (a '\\r' before it is dropped), a trailing empty line is
  ignored. Row 0 holds the column names; columns are read by name, so the
  order and any extra column (xlog's Tag) do not matter.
- Thread, Size: unsigned decimal (std::stoul/stoull: leading spaces, digits
  up to the first non-digit, at least one digit).
- Pointer: "(nil)" is 0, otherwise std::stoull base 16 ("0x" prefix
  allowed).
- Stream: unsigned decimal, as Thread. (RMM's writer prints the stream in
  hex; xlog's Stream is its own small stream id, the same text either way
  below 10.)
- Action: exactly "allocate", "free" or "allocate failure"; anything else
  throws ("Invalid action string").
- Time is not parsed by parse_csv; RMM's logger writes it as %H:%M:%S.%f
  (hours:minutes:seconds.microseconds) and its parse_time reads four
  numbers around single-character delimiters.

Beyond what the parser needs, the test holds xlog to the writer's exact
shape: the header's first six names in RMM's order, the time with six
digits of microseconds, the pointer as lowercase 0x-hex, sizes and
streams in plain decimal.
"""

from __future__ import annotations

import re

import pytest

import xlog_cuda as xc

RMM_HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
RMM_ACTIONS = ("allocate", "free", "allocate failure")
U64 = 1 << 64


class RmmParseError(Exception):
    pass


def rapidcsv_rows(text: str):
    """Rows as rapidcsv's ParseCsv splits them (default parameters)."""
    rows, row, cell, quoted = [], [], "", False

    def unquote(c: str) -> str:
        if len(c) >= 2 and c[0] == '"' and c[-1] == '"':
            return c[1:-1].replace('""', '"')
        return c

    for ch in text:
        if ch == '"':
            if cell == "" or cell[0] == '"':
                quoted = not quoted
            cell += ch
        elif ch == "," and not quoted:
            row.append(unquote(cell))
            cell = ""
        elif ch == "\r":
            continue  # counted as a line-ending character, never kept
        elif ch == "\n":
            row.append(unquote(cell))
            rows.append(row)
            row, cell, quoted = [], "", False
        else:
            cell += ch
    if row or cell:
        row.append(unquote(cell))
        rows.append(row)
    return rows


def sto_unsigned(text: str, base: int = 10) -> int:
    """std::stoull(text, nullptr, base): strtoull's reading, with
    invalid_argument for no digits and out_of_range past 64 bits."""
    s = text.lstrip(" \t\n\v\f\r")
    negative = False
    if s[:1] in "+-" and s[:1] != "":
        negative = s[0] == "-"
        s = s[1:]
    if base == 16 and s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        s = s[2:]
    digits = "0123456789abcdef"[:base]
    n = 0
    while n < len(s) and s[n].lower() in digits:
        n += 1
    if n == 0:
        raise RmmParseError(f"invalid_argument: {text!r}")
    value = int(s[:n], base)
    if value >= U64:
        raise RmmParseError(f"out_of_range: {text!r}")
    return (-value) % U64 if negative else value


def rmm_parse_csv(text: str):
    """rmm::detail::parse_csv: (thread, action, size, pointer, stream, index)."""
    rows = rapidcsv_rows(text)
    if not rows:
        raise RmmParseError("no header")
    names = {name: i for i, name in enumerate(rows[0])}
    for needed in ("Thread", "Action", "Pointer", "Size", "Stream"):
        if needed not in names:
            raise RmmParseError(f"column not found: {needed}")

    def column(name, convert):
        i = names[name]
        out = []
        for r, row in enumerate(rows[1:]):
            if i >= len(row):
                raise RmmParseError(f"requested column index {i} >= {len(row)} (number of columns on row index {r})")
            out.append(convert(row[i]))
        return out

    threads = column("Thread", sto_unsigned)
    actions = column("Action", str)
    pointers = column("Pointer", lambda s: 0 if s == "(nil)" else sto_unsigned(s, 16))
    sizes = column("Size", sto_unsigned)
    streams = column("Stream", sto_unsigned)
    events = []
    for i, action in enumerate(actions):
        if action not in RMM_ACTIONS:
            raise RmmParseError(f"Invalid action string: {action!r} (row {i + 1})")
        events.append((threads[i], action, sizes[i], pointers[i], streams[i], i))
    return events


def rmm_parse_time(text: str) -> int:
    """rmm::detail::parse_time: microseconds since midnight."""
    m = re.fullmatch(r"(\d+).(\d+).(\d+).(\d+)", text)
    if not m:
        raise RmmParseError(f"time {text!r}")
    h, mi, s, us = (int(g) for g in m.groups())
    return ((h * 60 + mi) * 60 + s) * 1_000_000 + us


def _make_log(tmp_path, make_runtime):
    """A real xlog log: three streams, tags with CSV metacharacters, an
    injected allocation failure; every block freed before close (no leak
    rows). It also holds xlog's reserve/release/retire rows, which the
    tests filter out as the docs say."""
    path = tmp_path / "xlog.csv"
    rt = make_runtime(log_path=str(path), budget_bytes=64 << 20)
    streams = [rt.acquire_stream() for _ in range(3)]
    made = []
    for i, tag in enumerate(["plain", "with, comma", 'with "quote"', "", "x" * 40]):
        made.append(rt.allocate(4096 * (i + 1), streams[i % 3], tag=tag))
    # Armed for the next driver allocation: 4 MiB fits in no page the arena
    # mapped already (nor in a pool cache), so it is one.
    rt.sim_inject_fault("alloc", 1)
    with pytest.raises(xc.DriverError):
        rt.allocate(4 << 20, streams[0], tag="refused")
    for b in made:
        b.free()
    rt.drain()
    for s in streams:
        s.release()
    rt.close()
    return path, made, streams


XLOG_ACTIONS = ("reserve", "release", "retire", "leak", "unreleased stream")


def rmm_rows(text: str) -> str:
    """The filter docs/frameworks.md gives: the header and the rows of
    RMM's actions (the Action column is the third; Thread and Time never
    hold a comma)."""
    lines = text.splitlines(keepends=True)
    return lines[0] + "".join(r for r in lines[1:] if r.split(",")[2] in RMM_ACTIONS)


def test_rmm_parser_reads_an_xlog_log(tmp_path, make_runtime):
    path, made, streams = _make_log(tmp_path, make_runtime)
    text = rmm_rows(path.read_text())
    events = rmm_parse_csv(text)
    allocs = [e for e in events if e[1] == "allocate"]
    frees = [e for e in events if e[1] == "free"]
    failures = [e for e in events if e[1] == "allocate failure"]
    assert len(allocs) == len(frees) == len(made) and len(failures) == 1
    # What RMM reads is what happened: pointers, sizes, streams.
    assert [(e[3], e[2], e[4]) for e in allocs] == [(b.ptr, b.size, b.stream) for b in made]
    assert sorted(e[3] for e in frees) == sorted(b.ptr for b in made)
    assert failures[0][2] == 4 << 20 and failures[0][3] == 0
    assert {e[4] for e in allocs} == {s.id for s in streams}
    # The replay pairs every free with an earlier allocate of that pointer.
    seen = set()
    for e in events:
        if e[1] == "allocate":
            seen.add(e[3])
        elif e[1] == "free":
            assert e[3] in seen


def test_the_first_six_columns_are_rmm_writers_exact_shape(tmp_path, make_runtime):
    path, made, _ = _make_log(tmp_path, make_runtime)
    rows = rapidcsv_rows(rmm_rows(path.read_text()))
    assert rows[0][:6] == RMM_HEADER and rows[0][6:] == ["Tag", "Device", "Process", "Detail"]
    times = []
    for row in rows[1:]:
        thread, clock, action, pointer, size, stream = row[:6]
        assert re.fullmatch(r"[0-9]+", thread), row
        assert re.fullmatch(r"[0-2][0-9]:[0-5][0-9]:[0-5][0-9]\.[0-9]{6}", clock), row  # %H:%M:%S.%f
        assert action in RMM_ACTIONS, row
        assert re.fullmatch(r"0x[0-9a-f]+", pointer), row
        assert re.fullmatch(r"[0-9]+", size) and re.fullmatch(r"[0-9]+", stream), row
        times.append(rmm_parse_time(clock))
    # In log order (one thread here); a log spanning midnight would wrap.
    assert times == sorted(times)
    # The tags survive the CSV quoting RMM's reader applies.
    assert [r[6] for r in rows[1:] if r[2] == "allocate"] == ["plain", "with, comma", 'with "quote"', "", "x" * 40]


def test_parser_is_strict_where_rmm_is():
    good = "Thread,Time,Action,Pointer,Size,Stream\n7,10:00:00.000001,allocate,0x7f00,256,0\n"
    assert rmm_parse_csv(good) == [(7, "allocate", 256, 0x7F00, 0, 0)]
    assert rmm_parse_csv(good.replace("0x7f00", "(nil)"))[0][3] == 0
    with pytest.raises(RmmParseError, match="Invalid action"):
        rmm_parse_csv(good.replace("allocate", "leak"))
    with pytest.raises(RmmParseError, match="invalid_argument"):
        rmm_parse_csv(good.replace(",256,", ",size,"))
    with pytest.raises(RmmParseError, match="column not found"):
        rmm_parse_csv(good.replace("Stream", "Strm"))


def test_xlog_only_rows_and_how_to_filter_them(tmp_path, make_runtime):
    """xlog also writes `reserve`, `release`, `retire`, `leak` and
    `unreleased stream` rows (the stream `s` is still acquired at close): RMM's
    parser rejects them, as it rejects anything but its three actions.
    Keeping RMM's actions only (the filter docs/frameworks.md gives) yields
    a log RMM reads, with every allocate, free and refusal."""
    path = tmp_path / "leaky.csv"
    rt = make_runtime(log_path=str(path))
    with rt.acquire_stream() as s:
        kept = rt.allocate(4096, s, tag="kept")
        rt.allocate(8192, s, tag="freed").free()
        rt.trim()  # release and retire rows
        rt.close()  # still live: a leak row
    text = path.read_text()
    actions = {line.split(",")[2] for line in text.splitlines()[1:]}
    assert actions == set(RMM_ACTIONS[:2]) | set(XLOG_ACTIONS), actions
    with pytest.raises(RmmParseError, match="Invalid action string: 'reserve'"):
        rmm_parse_csv(text)
    events = rmm_parse_csv(rmm_rows(text))
    assert [e[1] for e in events if e[3] == kept.ptr] == ["allocate", "free"]  # close freed it
    assert sum(1 for e in events if e[1] == "allocate") == 2

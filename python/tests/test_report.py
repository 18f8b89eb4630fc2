"""The memory report (xlog_cuda.report): what it reads from a log, and
that a 1,000,000-line log renders in time."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from xlog_cuda import report

from conftest import PYTHON_DIR, pool_memory

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag\n"


def _write(tmp_path, body: str, header: str = HEADER):
    path = tmp_path / "log.csv"
    path.write_text(header + body)
    return str(path)


def _embedded(page: str) -> dict:
    m = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def test_live_bytes_peak_and_blocks_at_the_peak(tmp_path):
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0x100,1000,1,weights\n"
        "1,10:00:00.100000,allocate,0x200,300,2,act\n"
        "1,10:00:00.200000,allocate,0x300,700,1,act\n"   # peak: 2000 bytes
        "1,10:00:00.300000,free,0x200,300,2,act\n"
        "1,10:00:00.400000,allocate,0x400,100,2,scratch\n"
        "1,10:00:00.500000,free,0x300,700,1,act\n"
        "1,10:00:00.600000,free,0x400,100,2,scratch\n"
    ))
    d = report.analyze(log, points=50)
    assert d["counts"] == {"allocate": 4, "free": 3, "leak": 0, "refusal": 0}
    assert d["peak"]["bytes"] == 2000 and d["peak"]["clock"] == "10:00:00.200000"
    assert abs(d["peak"]["t"] - 0.2) < 1e-9
    assert [(b["tag"], b["size"]) for b in d["peak"]["listed"]] == [("weights", 1000), ("act", 700), ("act", 300)]
    assert sorted(d["peak"]["by_tag"]) == [["act", 2, 1000], ["weights", 1, 1000]]
    assert d["live_at_end"] == {"bytes": 1000, "blocks": 1}
    s = d["series"]
    assert max(s["total"]) == 2000 and s["total"][-1] == 1000
    # Stacked by tag and by stream, the parts add up to the total everywhere.
    for i in range(len(s["t"])):
        assert sum(v[i] for v in s["by_tag"]) == s["total"][i]
        assert sum(v[i] for v in s["by_stream"]) == s["total"][i]
    tags = {t["tag"]: t for t in d["tags"]}
    assert tags["act"]["allocations"] == 2 and tags["act"]["peak_live"] == 1000 and tags["act"]["live_at_end"] == 0
    assert {b["lo"]: b["count"] for b in d["histogram"]} == {64: 1, 256: 1, 512: 2}


def test_leaks_refusals_and_unknown_actions(tmp_path):
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0xa0,4096,1,kept\n"
        "1,10:00:00.000010,allocate,0xb0,512,1,\"odd, tag\"\n"
        "2,10:00:00.000020,allocate failure,0x0,99999,1,big,xlog_allocate: out of budget: requested 99999 bytes\n"
        "2,10:00:00.000025,refused,0x0,12345,3,other\n"
        "1,10:00:00.000030,compact,0xb0,512,1,\"odd, tag\"\n"   # a future action: not an event
        "1,10:00:00.000040,free,0xb0,512,1,\"odd, tag\"\n"
        "1,10:00:00.000050,free,0xdead,64,1,unknown\n"         # never allocated in this log
        "1,10:00:00.000060,allocate,0xc0,256,1,cache\n"
        "garbage line\n"
        "1,10:00:00.000070,leak,0xc0,256,1,cache\n"
        "1,10:00:00.000080,free,0xc0,256,1,cache\n"            # close frees what it reported
        "1,10:00:00.000090,leak,0xe0,8,1,before-the-log\n"
    ))
    d = report.analyze(log)
    assert d["peak"]["bytes"] == 4096 + 512
    assert d["other_actions"] == {"compact": 1}
    assert d["unmatched_frees"] == {"count": 1, "bytes": 64}
    assert d["bad_rows"]["count"] == 1 and d["bad_rows"]["first"][0]["line"] == 10
    r = d["refusals"]
    assert r["count"] == 2 and r["bytes"] == 99999 + 12345
    assert r["listed"][0]["message"] == "xlog_allocate: out of budget: requested 99999 bytes"
    assert r["listed"][1]["action"] == "refused" and r["listed"][1]["message"] == ""
    L = d["leaks"]
    assert (L["never_freed"], L["never_freed_bytes"], L["reported_rows"]) == (1, 4096, 2)
    assert [(b["tag"], b["reported"], b["freed_in_log"]) for b in L["listed"]] == [("kept", False, False), ("cache", True, True)]
    assert [x["tag"] for x in L["reported_not_allocated_in_log"]] == ["before-the-log"]
    assert {t["tag"] for t in d["tags"]} == {"kept", "odd, tag", "cache"}


def test_times_wrap_at_midnight_and_a_missing_clock_falls_back_to_event_order(tmp_path):
    log = _write(tmp_path, (
        "1,23:59:59.500000,allocate,0x1,10,1,a\n"
        "1,00:00:00.250000,allocate,0x2,20,1,a\n"
        "1,00:00:01.000000,free,0x1,10,1,a\n"
    ))
    d = report.analyze(log)
    assert abs(d["duration_s"] - 1.5) < 1e-6 and abs(d["peak"]["t"] - 0.75) < 1e-6
    assert d["series"]["axis"] == "time"
    flat = _write(tmp_path, "".join(f"1,12:00:00.000000,allocate,{i:#x},8,1,a\n" for i in range(1, 5)))
    assert report.analyze(flat)["series"]["axis"] == "event"


def test_not_a_log_is_a_clear_error(tmp_path):
    with pytest.raises(report.ReportError, match="lacks Action, Pointer, Size"):
        report.analyze(_write(tmp_path, "", header="a,b,c\n"))
    with pytest.raises(report.ReportError, match="empty"):
        report.analyze(_write(tmp_path, "", header=""))
    with pytest.raises(report.ReportError, match="cannot open"):
        report.analyze(str(tmp_path / "missing.csv"))


def test_the_page_is_self_contained_and_tags_cannot_escape_the_script(tmp_path):
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,10,1,</script><img src=x onerror=alert(1)>\n")
    page = report.render_html(report.analyze(log))
    assert page.count("</script>") == 3  # the error hook, the data, the code
    assert "<img" not in page
    assert _embedded(page)["tags"][0]["tag"] == "</script><img src=x onerror=alert(1)>"
    assert not re.search(r"(src|href)=\"https?:", page) and "cdn" not in page.lower()


def _run(args, cwd):
    env = {**os.environ, "PYTHONPATH": PYTHON_DIR}
    return subprocess.run([sys.executable, "-m", "xlog_cuda.report", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_cli_writes_the_page(tmp_path):
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,4096,1,t\n")
    out = _run([log, "-o", str(tmp_path / "r.html")], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1 allocations, peak 4,096 bytes" in out.stdout
    assert _embedded((tmp_path / "r.html").read_text())["peak"]["bytes"] == 4096
    bad = _run([str(tmp_path / "nope.csv")], tmp_path)
    assert bad.returncode == 2 and "cannot open" in bad.stderr


def test_png_needs_matplotlib(tmp_path):
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,4096,1,t\n1,10:00:00.100000,free,0x1,4096,1,t\n")
    out = _run([log, "-o", str(tmp_path / "r.html"), "--png", str(tmp_path / "r.png")], tmp_path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert out.returncode == 2
        assert "--png needs matplotlib" in out.stderr and "pip install matplotlib" in out.stderr
        assert not (tmp_path / "r.html").exists()  # refused before doing the work
        return
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _big_log(path, lines: int) -> None:
    """`lines` rows of a plausible log: a churn of allocations and frees
    over 40 tags and 4 streams, times crossing midnight."""
    rng = random.Random(7)
    tags = [f"tag{i}" for i in range(40)]
    live = []
    t = 86400 - 30.0
    ptr = 0x7F0000000000
    out = [HEADER]
    for _ in range(lines - 1):
        t += rng.random() * 1e-4
        s = t % 86400
        clock = "%02d:%02d:%09.6f" % (s // 3600, s // 60 % 60, s % 60)
        if live and (len(live) > 3000 or rng.random() < 0.5):
            p, size, st, tag = live.pop(rng.randrange(len(live)))
            out.append(f"1,{clock},free,{p:#x},{size},{st},{tag}\n")
        else:
            size = rng.choice((256, 4096, 65536, 1 << 20)) * rng.randint(1, 8)
            ptr += size + 256
            item = (ptr, size, rng.randint(1, 4), rng.choice(tags))
            live.append(item)
            out.append(f"1,{clock},allocate,{item[0]:#x},{item[1]},{item[2]},{item[3]}\n")
    with open(path, "w") as f:
        f.writelines(out)


def test_a_million_lines_render_in_ten_seconds(tmp_path):
    log = tmp_path / "big.csv"
    _big_log(log, 1_000_000)
    started = time.perf_counter()
    data = report.write_report(str(log), str(tmp_path / "big.html"))
    took = time.perf_counter() - started
    limit = float(os.environ.get("XLOG_REPORT_MAX_SECONDS", "10"))
    print(f"1,000,000 lines: {took:.2f} s")
    assert data["lines"] == 1_000_000 and data["counts"]["allocate"] + data["counts"]["free"] == 999_999
    assert took <= limit, f"{took:.2f} s for 1,000,000 lines (limit {limit} s)"
    size = os.path.getsize(tmp_path / "big.html")
    assert size < 3 << 20, f"the page is {size} bytes: the series was not downsampled"
    assert len(data["series"]["t"]) == report.DEFAULT_POINTS


def test_an_rmm_log_reads_too(tmp_path):
    """RMM's logging adaptor's own log: six columns (no Tag), "(nil)" for a
    failed allocation's pointer, the HH:MM:SS:us time RMM's parser documents."""
    log = _write(tmp_path, (
        "140234,10:00:00:000001,allocate,0x7f00,256,0\n"
        "140234,10:00:00:000101,allocate failure,(nil),99999999,0\n"
        "140234,10:00:00:000201,free,0x7f00,256,0\n"
    ), header="Thread,Time,Action,Pointer,Size,Stream\n")
    d = report.analyze(log)
    assert d["counts"] == {"allocate": 1, "free": 1, "leak": 0, "refusal": 1}
    assert d["peak"]["bytes"] == 256 and abs(d["duration_s"] - 0.0002) < 1e-9
    assert d["tag_labels"] == ["(no tag)"] and d["refusals"]["listed"][0]["size"] == 99999999


def test_a_real_log_rebuilds_cached_pending_and_refusals(tmp_path, make_runtime):
    """A runtime's own log (reserve/release/retire rows, a refusal with its
    reason in Detail): the report's live, cached and pending at the end
    equal the runtime's stats before close, and the peak of what it held
    equals the runtime's peak_outstanding_bytes."""
    import xlog_cuda as xc

    path = tmp_path / "run.csv"
    # Four 2 MiB pages (the arena maps and charges pages; the pool blocks).
    rt = make_runtime(log_path=str(path), budget_bytes=8 << 20)
    with rt.acquire_stream() as s:
        a = rt.allocate(2400 << 10, s, tag="a")
        b = rt.allocate(1600 << 10, s, tag="b")
        a.free()
        with pytest.raises(xc.OutOfBudgetError):
            rt.allocate(7200 << 10, s, tag="huge")
        c = rt.allocate(512 << 10, s, tag="c")
        rt.trim(keep_bytes=0)
        rt.reap()
        st = rt.stats()
        d = report.analyze(str(path))
        held = d["held"]
        assert held["known"]
        if pool_memory():
            assert held["counts"]["reserve"] == st.cache_misses  # a reserve row per driver allocation
        else:
            # A reserve row per miss that created pages (a miss served by
            # recycled or lent pages creates none).
            assert 1 <= held["counts"]["reserve"] <= st.cache_misses
        assert held["at_end"]["live"] == st.live_bytes
        assert (held["at_end"]["cached"], held["at_end"]["pending"]) == (st.cached_bytes, st.pending_bytes)
        assert held["peak"]["bytes"] == st.peak_outstanding_bytes
        r = d["refusals"]
        assert r["count"] == st.failed_allocations == 1
        msg = r["listed"][0]["message"]
        assert r["listed"][0]["tag"] == "huge" and "requested 7372800" in msg and "limit 8388608" in msg, msg
        assert d["other_actions"] == {}
        b.free()
        c.free()
    rt.close()
    d = report.analyze(str(path))
    assert d["held"]["at_end"] == {"live": 0, "cached": 0, "pending": 0, "held": 0}
    assert d["leaks"]["blocks"] == 0


def test_a_shared_log_with_a_repeated_header_reads(tmp_path):
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0x100,1000,1,x\n"
        "Thread,Time,Action,Pointer,Size,Stream,Tag\n"
        "1,10:00:00.100000,free,0x100,1000,1,x\n"
    ))
    d = report.analyze(log)
    assert d["counts"]["allocate"] == d["counts"]["free"] == 1
    assert d["bad_rows"]["count"] == 0 and d["other_actions"] == {} and not d["held"]["known"]


# Issue 25: rows the docstring promises to count as bad and go on past,
# from RMM logs and hand-edited files as much as from xlog's own.


def test_sizes_out_of_range_are_bad_rows_and_reading_goes_on(tmp_path):
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0x100,99999999999999999999999,1,huge\n"  # past int64
        "1,10:00:00.100000,allocate,0x200,-5,1,negative\n"
        "1,10:00:00.200000,free,0x200,-5,1,negative\n"
        "1,10:00:00.300000,reserve,0x300,-1,1,\n"
        "1,10:00:00.400000,allocate,0x400,9223372036854775807,1,largest\n"  # 2**63 - 1 reads
        "1,10:00:00.500000,leak,0x500,99999999999999999999999,1,leaked\n"
        "1,10:00:00.600000,allocate failure,0x0,-7,1,refused\n"
    ))
    out = _run([log, "-o", str(tmp_path / "r.html")], tmp_path)
    assert out.returncode == 0, out.stderr
    d = _embedded((tmp_path / "r.html").read_text())
    assert d["bad_rows"]["count"] == 4
    whys = [b["why"] for b in d["bad_rows"]["first"]]
    assert whys == ["size 99999999999999999999999 is over 2**63 - 1", "size -5 is negative",
                    "size -5 is negative", "size -1 is negative"], whys
    assert d["counts"]["allocate"] == 1 and d["peak"]["bytes"] == (1 << 63) - 1
    assert d["refusals"]["count"] == 1 and d["refusals"]["bytes"] == 0
    assert d["leaks"]["reported_rows"] == 1


def test_a_field_past_the_csv_field_limit_is_a_bad_row_and_reading_goes_on(tmp_path):
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0x100,100,1," + "x" * 200_000 + "\n"
        "1,10:00:00.100000,allocate,0x200,300,1,after\n"
    ))
    out = _run([log, "-o", str(tmp_path / "r.html")], tmp_path)
    assert out.returncode == 0, out.stderr
    d = _embedded((tmp_path / "r.html").read_text())
    assert d["bad_rows"]["count"] == 1 and "field limit" in d["bad_rows"]["first"][0]["why"]
    assert [t["tag"] for t in d["tags"]] == ["after"] and d["peak"]["bytes"] == 300


def test_times_that_are_no_time_of_day_are_left_out_and_never_hang(tmp_path):
    # NaN and infinite times crashed the page's JSON and the resampling; a
    # time of 1e308 s made the resampling fill that many empty intervals.
    for bad_time in ("nan", "inf", "-inf", "1e308", "00:00:1e400", "-5"):
        log = _write(tmp_path, (
            "1,10:00:00.000000,allocate,0x100,100,1,a\n"
            f"1,{bad_time},allocate,0x200,200,1,b\n"
            "1,10:00:01.000000,free,0x100,100,1,a\n"
        ))
        out = _run([log, "-o", str(tmp_path / "r.html")], tmp_path)
        assert out.returncode == 0, (bad_time, out.stderr)
        d = _embedded((tmp_path / "r.html").read_text())
        assert d["peak"]["bytes"] == 300 and d["duration_s"] == 1.0, (bad_time, d["duration_s"])


def test_placeholders_in_the_title_or_file_name_are_filled_in_once(tmp_path):
    log = tmp_path / "__DATA__ __TITLE__.csv"
    log.write_text(HEADER + "1,10:00:00.000000,allocate,0x1,4096,1,t\n")
    out = _run([str(log), "-o", str(tmp_path / "named.html")], tmp_path)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "named.html").read_text()
    assert "<title>xlog memory report: __DATA__ __TITLE__.csv</title>" in page
    out = _run([str(log), "-o", str(tmp_path / "titled.html"), "--title", "run __DATA__ of __TITLE__"], tmp_path)
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "titled.html").read_text()
    assert "<title>run __DATA__ of __TITLE__</title>" in page
    assert page.count('"format":1') == 1, "the data is in the page once, in its script"
    assert _embedded(page)["peak"]["bytes"] == 4096


def test_the_help_and_the_error_name_both_column_sets(tmp_path):
    """xlog writes 10 columns, RMM 6: the --help text and the error for a
    log without the required columns name both (the help once said 7)."""
    out = _run(["--help"], tmp_path)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "10 columns" in text and "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail" in text
    assert "6 columns: Thread,Time,Action,Pointer,Size,Stream\n" in out.stdout and "7 columns" not in text
    with pytest.raises(report.ReportError) as e:
        report.analyze(_write(tmp_path, "", header="Thread,Time,Pointer\n"))
    msg = str(e.value)
    assert "lacks Action, Size" in msg and "10 columns" in msg and "6 columns" in msg and "Detail" in msg


def test_empty_cards_say_so_in_words(tmp_path):
    """No card reads "0 B in 0": nothing live at the end, no leaks, no
    refusals are written as words; the peak label sits above the plot."""
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,4096,1,t\n1,10:00:00.000100,free,0x1,4096,1,t\n")
    page = report.render_html(report.analyze(log))
    assert '" in " + num(D.live_at_end.blocks)' in page and 'D.live_at_end.blocks ? ' in page
    assert '"data-role": "peak-label"' in page and "y: M.t - 9" in page


def test_allocate_rows_carry_the_call_site_in_detail(tmp_path, make_runtime):
    """With track_call_sites=True the log's allocate rows name the call site
    in Detail (an explicit one, a thread label, or the Python traceback
    summary); without tracking Detail stays empty."""
    import csv

    import xlog_cuda as xc

    path = tmp_path / "sites.csv"
    rt = make_runtime(log_path=str(path), track_call_sites=True)
    with rt.acquire_stream() as s:
        a = rt.allocate(4096, s, tag="a", call_site="model.py:12 in forward")
        with xc.call_site("encoder block"):
            b = rt.allocate(8192, s, tag="b", call_site="")  # "": no site of its own, the label
        c = rt.allocate(1024, s, tag="c")  # the traceback summary
        for blk in (a, b, c):
            blk.free()
    rt.close()
    rows = [r for r in csv.DictReader(open(path)) if r["Action"] == "allocate"]
    sites = [r["Detail"] for r in rows]
    assert sites[0] == "model.py:12 in forward" and sites[1] == "encoder block", sites
    assert sites[2].startswith("test_report.py:") and "test_allocate_rows_carry_the_call_site_in_detail" in sites[2]

    plain = tmp_path / "plain.csv"
    rt = make_runtime(log_path=str(plain))
    with rt.acquire_stream() as s:
        rt.allocate(4096, s, tag="a", call_site="ignored.py:1").free()
    rt.close()
    assert [r["Detail"] for r in csv.DictReader(open(plain)) if r["Action"] == "allocate"] == [""]


SITES_HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail\n"


def test_blocks_are_grouped_by_call_stack_at_the_peak_and_at_the_end(tmp_path):
    """Detail of allocate rows is the call site: the blocks live at the peak
    (and at the end) are grouped by it, most bytes first, and each listed
    block names its site."""
    fwd = "model.py:10 in forward <- train.py:5 in step"
    opt = "optim.py:3 in init"
    log = _write(tmp_path, (
        f"1,10:00:00.000000,allocate,0x100,1000,1,w,0,7,{opt}\n"
        f'1,10:00:00.000010,allocate,0x200,300,1,a,0,7,"{fwd}"\n'
        f"1,10:00:00.000020,allocate,0x300,200,1,a,0,7,{fwd}\n"
        "1,10:00:00.000030,allocate,0x400,50,1,a,0,7,\n"
        "1,10:00:00.000040,free,0x200,300,1,a,0,7,\n"
        "1,10:00:00.000050,free,0x300,200,1,a,0,7,\n"
        "1,10:00:00.000060,free,0x400,50,1,a,0,7,\n"
    ), header=SITES_HEADER)
    d = report.analyze(log)
    c = d["call_sites"]
    assert c["known"] and c["sites"] == 2 and (c["allocations_with_site"], c["allocations"]) == (3, 4)
    assert c["at_peak"] == [{"stack": opt, "blocks": 1, "bytes": 1000}, {"stack": fwd, "blocks": 2, "bytes": 500},
                            {"stack": "", "blocks": 1, "bytes": 50}]
    assert c["at_end"] == [{"stack": opt, "blocks": 1, "bytes": 1000}]
    assert [b["site"] for b in d["peak"]["listed"]] == [opt, fwd, fwd, ""]
    assert d["leaks"]["listed"][0]["site"] == opt
    page = report.render_html(d)
    assert _embedded(page)["call_sites"]["at_peak"][1]["stack"] == fwd


def test_a_log_without_call_sites_says_so(tmp_path):
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,10,1,t\n")
    d = report.analyze(log)
    assert d["call_sites"] == {"known": False} and "site" not in d["peak"]["listed"][0]
    # A refusal's reason in Detail is no call site.
    log = _write(tmp_path, "1,10:00:00.000000,allocate failure,0x0,10,1,t,0,7,out of budget\n", header=SITES_HEADER)
    assert report.analyze(log)["call_sites"] == {"known": False}


def test_lifetimes_are_the_largest_blocks_in_allocation_order(tmp_path):
    """The per-block view: the N largest blocks (N shown), each as [start,
    end, size, tag, site, address, block] on the timeline's axis; a block
    never freed has end None."""
    log = _write(tmp_path, (
        "1,10:00:00.000000,allocate,0x1000,100,1,a,0,7,s1\n"
        "1,10:00:00.000100,allocate,0x2000,400,1,b,0,7,s2\n"
        "1,10:00:00.000200,allocate,0x3000,300,1,a,0,7,\n"
        "1,10:00:00.000300,free,0x2000,400,1,b,0,7,\n"
        "1,10:00:00.000400,allocate,nil,200,1,a,0,7,s1\n"
        "1,10:00:00.000500,free,0x1000,100,1,a,0,7,\n"
    ), header=SITES_HEADER)
    L = report.analyze(log, blocks=3)["lifetimes"]
    assert (L["total"], L["shown"], L["limit"], L["smallest_shown"]) == (4, 3, 3, 200)
    rows = L["blocks"]
    assert [r[6] for r in rows] == [1, 2, 3]  # allocation order; block 0 (100 B) left out
    assert rows[0][:3] == [0.0001, 0.0003, 400] and rows[1][1] is None and rows[2][1] is None
    assert [L["tags"][r[3]] for r in rows] == ["b", "a", "a"]
    assert [L["sites"][r[4]] if r[4] >= 0 else "" for r in rows] == ["s2", "", "s1"]
    assert [r[5] for r in rows] == [0x2000, 0x3000, None]
    assert len(report.analyze(log)["lifetimes"]["blocks"]) == 4
    # No usable clock: the axis is event numbers.
    same = _write(tmp_path, "1,5,allocate,0x1,10,1,t\n1,5,allocate,0x2,20,1,t\n1,5,free,0x1,10,1,t\n")
    d = report.analyze(same)
    assert d["series"]["axis"] == "event" and d["lifetimes"]["blocks"] == [[0.0, 2.0, 10, 0, -1, 1, 0], [1.0, None, 20, 0, -1, 2, 1]]


def test_the_page_carries_the_zoom_and_the_block_view(tmp_path):
    log = _write(tmp_path, "1,10:00:00.000000,allocate,0x1,4096,1,t\n")
    page = report.render_html(report.analyze(log))
    for needle in ('id="lifetimes"', 'id="callsites"', 'id="unzoom"', "function zoomTo", '"data-role": "brush"',
                   'addEventListener("dblclick"'):
        assert needle in page, needle
    out = _run([log, "-o", str(tmp_path / "r.html"), "--blocks", "0"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert _embedded((tmp_path / "r.html").read_text())["lifetimes"]["shown"] == 0

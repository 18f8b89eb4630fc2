"""`python -m xlog_cuda.replay`: an xlog or RMM allocation log replayed
through xlog on sim, its live peak against what xlog held (issue 24, item
5). Synthetic logs written here, with the live peaks worked out by hand."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, REPO_ROOT
from xlog_cuda import replay

MiB = 1 << 20
XLOG_HEADER = "Thread,Time,Action,Pointer,Size,Stream,Tag,Device,Process,Detail"
RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
TRACES = os.path.join(REPO_ROOT, "benches", "traces")


def _xlog_row(action, ptr, size, stream=1, device=0, process=100, tag="t", detail=""):
    return f"1,10:00:00.000001,{action},{ptr:#x},{size},{stream},{tag},{device},{process},{detail}"


def _write(tmp_path, name, lines, compress=False):
    text = "\n".join(lines) + "\n"
    path = tmp_path / name
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def _xlog_log():
    """Device 0: live peak 5 MiB (B 3 + C 2, after A 1 was freed); device 1:
    one 7 MiB block. Driver-traffic rows and a refusal are in between."""
    return [
        XLOG_HEADER,
        _xlog_row("reserve", 0x1000000, 1 * MiB),
        _xlog_row("allocate", 0x1000000, 1 * MiB, stream=1),
        _xlog_row("allocate", 0x2000000, 3 * MiB, stream=2),
        _xlog_row("allocate", 0x9000000, 7 * MiB, stream=1, device=1),
        _xlog_row("free", 0x1000000, 1 * MiB, stream=1),
        _xlog_row("release", 0x1000000, 1 * MiB, stream=0),
        _xlog_row("retire", 0x0, 1 * MiB, stream=0, detail="1 blocks"),
        _xlog_row("allocate failure", 0x0, 64 * MiB, detail='"requested 67108864 bytes, live 4194304"'),
        _xlog_row("allocate", 0x3000000, 2 * MiB, stream=1),
        _xlog_row("free", 0x2000000, 3 * MiB, stream=2),
        _xlog_row("leak", 0x3000000, 2 * MiB, stream=1),
        _xlog_row("free", 0x3000000, 2 * MiB, stream=1),
        _xlog_row("free", 0x9000000, 7 * MiB, stream=1, device=1),
    ]


def test_xlog_log_replays_to_its_live_peak(tmp_path):
    path = _write(tmp_path, "run.csv", _xlog_log())
    result = replay.run(path)
    t, s = result["trace"], result["replay"]["stats"]
    assert t["format"] == "xlog" and not t["compressed"]
    assert t["device"] == 0 and t["devices"] == {"0": 6, "1": 2}
    assert t["peak_live_bytes"] == 5 * MiB and t["peak_live_blocks"] == 2
    assert (t["allocate_rows"], t["free_rows"], t["streams"]) == (3, 3, 2)
    assert t["ignored_rows"] == {"reserve": 1, "release": 1, "retire": 1, "allocate failure": 1, "leak": 1}
    assert t["other_device_rows"] == 2 and t["bad_rows"] == 0 and t["unknown_frees"] == 0
    assert s["peak_live_bytes"] == 5 * MiB  # the arena's live bytes are the requested ones (512-aligned)
    assert s["allocations"] == 3 and s["deallocations"] == 3
    assert result["replay"]["refusals"] == 0 and result["replay"]["memory"] == "arena"
    assert s["peak_outstanding_bytes"] >= 5 * MiB
    assert result["held_ratio"] == pytest.approx(s["peak_outstanding_bytes"] / (5 * MiB), rel=1e-5)

    other = replay.run(path, device=1)
    assert other["trace"]["peak_live_bytes"] == 7 * MiB and other["trace"]["other_device_rows"] == 6

    pool = replay.run(path, memory="pool")
    assert pool["replay"]["memory"] == "pool" and pool["trace"]["peak_live_bytes"] == 5 * MiB
    assert pool["replay"]["stats"]["allocations"] == 3


def test_rmm_log_replays_to_its_live_peak(tmp_path):
    # RMM's writer: the stream as a hex cudaStream_t (0x0: the default
    # stream), pointers in hex; no Tag/Device/Process columns.
    rows = [
        RMM_HEADER,
        "140,10:00:00.000001,allocate,0x7f0000000000,4194304,0x0",
        "140,10:00:00.000002,allocate,0x7f0000400000,1048576,0x55d1c0a0b000",
        "140,10:00:00.000003,allocate failure,(nil),999999999999,0x0",
        "141,10:00:00.000004,free,0x7f0000000000,4194304,0x0",
        "140,10:00:00.000005,allocate,0x7f0000000000,2097152,0x55d1c0a0b000",
        "141,10:00:00.000006,allocate,0x7f0000800000,3145728,0x0",
        "140,10:00:00.000007,deallocate,0x7f0000400000,1048576,0x55d1c0a0b000",
        "140,10:00:00.000008,free,0x7f0000000000,2097152,0x55d1c0a0b000",
        "140,10:00:00.000009,free,0x7f0000800000,3145728,0x0",
    ]
    result = replay.run(_write(tmp_path, "rmm.csv", rows))
    t = result["trace"]
    assert t["format"] == "rmm" and t["device"] == 0
    # 4 + 1 = 5 MiB, then 1 + 2 + 3 = 6 MiB.
    assert t["peak_live_bytes"] == 6 * MiB and t["peak_live_blocks"] == 3
    assert t["streams"] == 2 and t["ignored_rows"] == {"allocate failure": 1}
    assert result["replay"]["stats"]["peak_live_bytes"] == 6 * MiB
    assert result["replay"]["refusals"] == 0


def test_bad_rows_are_counted_not_fatal(tmp_path, capsys):
    rows = _xlog_log()[:4] + [
        "garbage",
        _xlog_row("allocate", 0x4000000, 1 * MiB).replace(",1048576,", ",lots,"),
        _xlog_row("allocate", 0x4000000, 1 * MiB).replace("0x4000000", "0xzz"),
        _xlog_row("allocate", 0x5000000, 1 * MiB).replace(",0,100,", ",dev,100,"),
        "1,10:00:00.1,free,0x4000000",
        '1,10:00:00.1,allocate,0x6000000,1048576,1,"unterminated quote\x00',
        _xlog_row("free", 0xDEAD000, 1 * MiB),  # never allocated
        _xlog_row("free", 0x0, 0),  # free(nullptr)
        "",
        XLOG_HEADER,  # a second writer's header
        _xlog_row("mystery", 0x1, 1),
    ] + _xlog_log()[4:]
    path = _write(tmp_path, "bad.csv", rows)
    assert replay.main([path, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "bad row at line 5" in out
    t = json.loads((tmp_path / "r.json").read_text())["trace"]
    assert t["bad_rows"] == 6 and len(t["bad_examples"]) == 5
    assert t["unknown_frees"] == 1 and t["null_pointer_rows"] == 1
    assert t["ignored_rows"]["(header)"] == 1 and t["ignored_rows"]["mystery"] == 1
    assert t["peak_live_bytes"] == 5 * MiB


def test_reused_pointers_processes_and_scale(tmp_path):
    rows = [
        XLOG_HEADER,
        _xlog_row("allocate", 0x1000, 2 * MiB, process=1),
        _xlog_row("allocate", 0x1000, 3 * MiB, process=2),  # another process: its own address space
        _xlog_row("allocate", 0x1000, 1 * MiB + 1, process=1),  # process 1's free row is missing
        _xlog_row("free", 0x1000, 1 * MiB + 1, process=1),
        _xlog_row("free", 0x1000, 3 * MiB, process=2),
    ]
    path = _write(tmp_path, "reuse.csv", rows)
    t = replay.run(path)["trace"]
    assert t["missed_frees"] == 1 and t["unknown_frees"] == 0 and t["left_live_blocks"] == 0
    assert t["peak_live_bytes"] == 5 * MiB and t["streams"] == 2  # stream 1 of each process
    scaled = replay.run(path, scale=4)["trace"]
    assert scaled["scale"] == 4 and scaled["peak_live_bytes"] == (5 * MiB) // 4


def test_bound_sets_the_exit_status(tmp_path, capsys):
    # 4 KiB live: the arena holds at least one 2 MiB page for it.
    path = _write(tmp_path, "small.csv", [XLOG_HEADER, _xlog_row("allocate", 0x1000, 4096),
                                          _xlog_row("free", 0x1000, 4096)])
    assert replay.main([path, "--max-held-ratio", "1.10"]) == 1
    assert "EXCEEDED" in capsys.readouterr().out
    assert replay.main([path, "--max-held-ratio", "100000", "-q"]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")
    assert replay.main([path]) == 0  # no bound, no verdict on it


def test_gzip_input(tmp_path):
    plain = replay.run(_write(tmp_path, "run.csv", _xlog_log()))
    packed = replay.run(_write(tmp_path, "run.csv.gz", _xlog_log(), compress=True))
    assert packed["trace"]["compressed"]
    assert packed["trace"]["peak_live_bytes"] == plain["trace"]["peak_live_bytes"] == 5 * MiB
    # Recognised by content, not by name.
    renamed = tmp_path / "run.log"
    os.rename(tmp_path / "run.csv.gz", renamed)
    assert replay.run(str(renamed))["trace"]["peak_live_bytes"] == 5 * MiB
    # A truncated gzip file cannot be read: exit 2, not a traceback.
    data = renamed.read_bytes()
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    assert replay.main([str(tmp_path / "cut.gz")]) == 2


def test_bad_arguments_and_unusable_files_exit_2(tmp_path, capsys):
    good = _write(tmp_path, "run.csv", _xlog_log())
    assert replay.main([str(tmp_path / "missing.csv")]) == 2
    assert replay.main([str(tmp_path)]) == 2  # a directory
    assert replay.main([_write(tmp_path, "other.csv", ["a,b,c", "1,2,3"])]) == 2
    assert replay.main([_write(tmp_path, "empty.csv", [""])]) == 2
    assert replay.main([_write(tmp_path, "none.csv", [XLOG_HEADER, _xlog_row("reserve", 0x1, 1)])]) == 2
    assert replay.main([good, "--device", "5"]) == 2
    assert "devices in the log: 0, 1" in capsys.readouterr().err
    for bad in (["--scale", "0"], ["--max-held-ratio", "-1"], ["--budget", "lots"], ["--memory", "heap"]):
        with pytest.raises(SystemExit) as e:
            replay.main([good] + bad)
        assert e.value.code == 2


def test_budget_refusals_are_counted(tmp_path):
    # 6 MiB live at the peak under a 4 MiB budget: the last block is refused.
    rows = [XLOG_HEADER] + [_xlog_row("allocate", 0x1000000 * i, 2 * MiB) for i in (1, 2, 3)]
    result = replay.run(_write(tmp_path, "tight.csv", rows), budget=4 * MiB)
    assert result["replay"]["refusals"] == 1 and result["replay"]["stats"]["failed_allocations"] >= 1
    assert result["replay"]["stats"]["peak_outstanding_bytes"] <= 4 * MiB


def test_a_peak_the_host_cannot_hold_is_scaled(tmp_path):
    # 1 PiB live: no host reserves a sim device for it; auto picks a scale.
    rows = [XLOG_HEADER, _xlog_row("allocate", 0x1000, 1 << 50), _xlog_row("free", 0x1000, 1 << 50)]
    path = _write(tmp_path, "huge.csv", rows)
    result = replay.run(path)
    k = result["trace"]["scale"]
    assert k > 1 and result["trace"]["peak_live_bytes"] == (1 << 50) // k
    assert result["replay"]["refusals"] == 0
    assert replay.main([path, "--scale", "1"]) == 2


def test_module_command_line_and_committed_traces(tmp_path):
    """The committed CI traces replay under the footprint bound (ctest
    replay_footprint runs the same), through `python -m`."""
    traces = sorted(f for f in os.listdir(TRACES) if f.endswith(".csv.gz"))
    assert traces
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    for name in traces:
        out = tmp_path / (name + ".json")
        proc = subprocess.run(
            [sys.executable, "-m", "xlog_cuda.replay", os.path.join(TRACES, name), "--max-held-ratio", "1.10",
             "--json", str(out)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result = json.loads(out.read_text())
        assert result["bound_ok"] and result["replay"]["refusals"] == 0
        assert result["trace"]["bad_rows"] == 0


def test_a_lagged_replay_gives_the_same_figures_every_time():
    """GpuLag holds the sim's streams at fixed points of the trace, so a
    lagged replay does not depend on how the host's threads are scheduled
    (the ctest replay_footprint bounds it, on machines busy or idle). The
    four-stream engine trace, whose frees cross streams, at lag 200."""
    path = os.path.join(TRACES, "h100-w11-engine.csv.gz")
    seen = set()
    for _ in range(3):
        stats = replay.run(path, gpu_lag=200)["replay"]["stats"]
        seen.add((stats["peak_outstanding_bytes"], stats["pages_mapped"], stats["pages_unmapped"]))
    assert len(seen) == 1, seen


def test_committed_trace_is_what_the_generator_makes(tmp_path):
    sys.path.insert(0, os.path.join(REPO_ROOT, "benches"))
    try:
        import make_trace
    finally:
        sys.path.pop(0)
    with gzip.open(os.path.join(TRACES, "train_varlen.csv.gz"), "rt") as f:
        committed = f.read()
    assert make_trace.make(200, 7) == committed


def test_check_access_passes_a_replay_and_is_reported(tmp_path, capsys):
    path = _write(tmp_path, "run.csv", _xlog_log())
    for lag in (0, 2):
        result = replay.run(path, gpu_lag=lag, check_access=True)
        assert result["replay"]["check_access"] and result["replay"]["access_faults"] == 0
        assert result["replay"]["first_access_fault"] == ""
    assert replay.run(path)["replay"]["check_access"] is False
    assert replay.main([path, "--check-access", "--gpu-lag", "2"]) == 0
    assert "access checks: 0 failed" in capsys.readouterr().out


def test_sim_touch_finds_unmapped_memory_and_shared_physical_bytes():
    from xlog_cuda._config import Config
    from xlog_cuda._runtime import Runtime

    rt = Runtime(device=0, config=Config(backend="sim", memory="arena", sim_capacity_bytes=1 << 30))
    try:
        s = rt.acquire_stream()
        a = rt.allocate(4 * MiB, s)
        rt.sim_touch(s, a.ptr, 4 * MiB, "take")
        s.synchronize()
        assert rt.sim_touch_faults() == (0, "")
        # A second block taking the same physical bytes while A holds them.
        rt.sim_touch(s, a.ptr + 4096, 512, "take")
        s.synchronize()
        count, message = rt.sim_touch_faults()
        assert count == 1 and "in use by the block at" in message
        rt.sim_touch(s, a.ptr, 4 * MiB, "give")
        ptr = a.ptr
        a.free()
        s.synchronize()
        rt.trim()
        # The address, unmapped by the trim: a kernel there would fault.
        rt.sim_touch(s, ptr, 4 * MiB)
        s.synchronize()
        count, message = rt.sim_touch_faults()
        assert count == 2 and message.count("in use by the block at") == 1  # the first failure is named
        with pytest.raises(Exception):
            rt.sim_touch(s, ptr, 1, "borrow")
    finally:
        rt.close()

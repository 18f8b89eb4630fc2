"""Config, the environment variables, and the byte-size parser (which must
agree with the library's own parser on every input)."""

from __future__ import annotations

import ctypes

import pytest

import xlog_cuda as xc

GOOD_SIZES = {
    "512MiB": 512 << 20,
    "8GiB": 8 << 30,
    "1.5GiB": 3 << 29,
    " 4096 ": 4096,
    "2GB": 2_000_000_000,
    "64k": 65536,
    "64K": 65536,
    "64kb": 64_000,
    "64KiB": 65536,
    "3 MB": 3_000_000,
    "3m": 3 << 20,
    "1t": 1 << 40,
    "1TB": 10**12,
    "7B": 7,
    "0": 0,
    "0.5KiB": 512,
    "2.0": 2,
    "18446744073709551615": (1 << 64) - 1,
    "0000000000000000000000000042": 42,
    ".5k": 512,
    # Exact past 2**53, where a double would round (issue 17.3).
    "9007199254740993.0": 9007199254740993,
    "18446744073709551615.000": (1 << 64) - 1,
    "0.000000000931322574615478515625GiB": 1,
    "8589934591.999999999068677425384521484375GiB": (1 << 63) - 1,
    "1.000000001GB": 1_000_000_001,
}
BAD_SIZES = ["", "abc", "12xyz", "-5", "1.2.3GiB", "99999999999999999999", "20000000TiB",
             "0.3B", "1.5", "16EiB", "18446744073709551616", "17179869184GiB", "1e3", "+5", ".",
             "18446744073709551615.5", "18446744073709551616.0", "1.0000000001GB",
             "0.0000000009313225746154785156GiB", "1." + "0" * 38 + "1"]


@pytest.mark.parametrize("text,value", sorted(GOOD_SIZES.items()))
def test_parse_size_accepts(text, value):
    assert xc.parse_size(text) == value


@pytest.mark.parametrize("text", BAD_SIZES)
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        xc.parse_size(text)


@pytest.mark.parametrize("text", sorted(GOOD_SIZES) + BAD_SIZES + ["1.1KiB", "1.25k", "0.001GB", "4.5MB"])
def test_parse_size_agrees_with_the_library(text, monkeypatch):
    """The same string through XLOG_BUDGET_BYTES and the library's parser."""
    monkeypatch.setenv("XLOG_BUDGET_BYTES", text)
    try:
        expected = xc.Config.from_env().budget_bytes
    except xc.InvalidArgumentError:
        expected = None
    try:
        mine = xc.parse_size(text)
    except ValueError:
        mine = None
    assert mine == expected


def test_non_utf8_environment_values_are_errors(monkeypatch):
    import os

    for name in ("XLOG_BUDGET_BYTES", "XLOG_BACKEND"):
        monkeypatch.setitem(os.environb, name.encode(), b"1\xffG")
        with pytest.raises(xc.InvalidArgumentError) as info:
            xc.Config.from_env()
        assert name in info.value.message and "not valid UTF-8" in info.value.message
        monkeypatch.delitem(os.environb, name.encode())
    # A log path is a file name: any bytes are one, and it is used as is.
    monkeypatch.setitem(os.environb, b"XLOG_LOG_PATH", b"/tmp/xlog-\xff.csv")
    assert os.fsencode(xc.Config.from_env().log_path) == b"/tmp/xlog-\xff.csv"


def test_budget_from_env(monkeypatch):
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "512MiB")
    assert xc.Config.from_env().budget_bytes == 512 << 20


def test_malformed_budget_names_the_variable(monkeypatch):
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "12xyz")
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Config.from_env()
    err = info.value
    assert err.status == xc.Status.INVALID_ARGUMENT
    assert "XLOG_BUDGET_BYTES" in err.message and "12xyz" in err.message
    assert xc.last_error() == err.message
    # Opening with the environment fails the same way.
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Runtime()
    assert "XLOG_BUDGET_BYTES" in info.value.message


def test_backend_and_log_path_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_LOG_PATH", str(tmp_path / "log.csv"))
    cfg = xc.Config.from_env()
    assert cfg.backend == "sim"
    assert cfg.log_path == str(tmp_path / "log.csv")
    monkeypatch.setenv("XLOG_BACKEND", "tpu")
    with pytest.raises(xc.InvalidArgumentError) as info:
        xc.Config.from_env()
    assert "XLOG_BACKEND" in info.value.message and "tpu" in info.value.message


def test_defaults_match_the_library(monkeypatch):
    monkeypatch.delenv("XLOG_SIM_DEVICES", raising=False)  # conftest sets it for the hook tests
    assert xc.Config.from_env() == xc.Config()
    assert xc.Config() == xc.Config(backend="auto", allocator="async", budget_bytes=0, stream_pool_size=16,
                                    log_path=None, sim_capacity_bytes=1 << 30, wait_on_pressure=False,
                                    cache=True, pool_release_threshold=(1 << 64) - 1)


def test_runtime_without_config_uses_env(monkeypatch):
    monkeypatch.setenv("XLOG_BACKEND", "sim")
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "2MiB")
    with xc.Runtime() as rt:
        assert rt.backend == "sim"
        assert rt.stats().budget_limit == 2 << 20
    # Overrides apply on top of the environment.
    with xc.Runtime(budget_bytes="3MiB") as rt:
        assert rt.stats().budget_limit == 3 << 20


def test_explicit_config_ignores_env(monkeypatch):
    monkeypatch.setenv("XLOG_BUDGET_BYTES", "12xyz")
    with xc.Runtime(config=xc.Config(backend="sim", budget_bytes="1.5KiB")) as rt:
        assert rt.stats().budget_limit == 1536


def test_config_round_trips_through_c():
    cfg = xc.Config(backend=xc.Backend.SIM, allocator="DIRECT", budget_bytes="1GB", stream_pool_size=3,
                    log_path="/tmp/x.csv", sim_capacity_bytes="64MiB", wait_on_pressure=True,
                    cache=False, pool_release_threshold="2GiB")
    raw = cfg.to_c()
    assert (raw.struct_size, raw.backend, raw.allocator, raw.budget_bytes) == (ctypes.sizeof(raw), 2, 1, 10**9)
    assert (raw.stream_pool_size, raw.log_path, raw.sim_capacity_bytes, raw.wait_on_pressure) == (
        3, b"/tmp/x.csv", 64 << 20, 1)
    assert (raw.cache, raw.pool_release_threshold) == (0, 2 << 30)
    assert xc.Config._from_c(raw) == xc.Config(backend="sim", allocator="direct", budget_bytes=10**9,
                                               stream_pool_size=3, log_path="/tmp/x.csv",
                                               sim_capacity_bytes=64 << 20, wait_on_pressure=True,
                                               cache=False, pool_release_threshold=2 << 30)

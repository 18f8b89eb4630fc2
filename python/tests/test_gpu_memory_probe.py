"""benches/gpu_memory_probe.py without a GPU: the summary of what it timed."""

from __future__ import annotations

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def probe():
    return load_bench("gpu_memory_probe")


def test_summary_gives_the_ratio_of_medians_and_the_range_of_pairs(probe):
    res = {
        "copy": {"caching": [1.0, 2.0, 3.0], "xlog": [1.1, 2.0, 3.6]},
        "gather": {"caching": [4.0, 4.0, 4.0], "xlog": [3.0, 4.0, 5.0]},
    }
    lines = probe.summary_lines(64, res)
    assert lines == [
        "64 MiB copy: caching 2.000 ms, xlog 2.000 ms, xlog/caching 1.000 (pairs 1.000-1.200)",
        "64 MiB gather: caching 4.000 ms, xlog 4.000 ms, xlog/caching 1.000 (pairs 0.750-1.250)",
    ]


def test_the_allocators_are_those_of_the_switch(probe):
    assert set(probe.MODES) == {"caching", "xlog"}

"""benches/torch_alloc_cost.py without a GPU: its size sequences are fixed
and within their bounds, and where PyTorch is missing the driver stops
with the failing allocator named, not a table of nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, load_bench

SCRIPT = os.path.join(REPO_ROOT, "benches", "torch_alloc_cost.py")


@pytest.fixture(scope="module")
def cost():
    return load_bench("torch_alloc_cost")


@pytest.mark.parametrize("kind, top", [("small", 2 << 20), ("mixed", 128 << 20)])
def test_size_sequences_are_fixed_and_within_bounds(cost, kind, top):
    sizes = cost.size_sequence(kind)
    assert sizes == cost.size_sequence(kind), "the same sequence every time"
    assert len(sizes) == 4096
    assert min(sizes) >= 512 and max(sizes) < top
    # Many sizes, mostly small: a varied-size workload, not one size.
    assert len(set(sizes)) > 3000
    assert sorted(sizes)[len(sizes) // 2] < (1 << 20)


def test_mixed_reaches_past_the_small_range(cost):
    assert max(cost.size_sequence("mixed")) > max(cost.size_sequence("small"))


def test_without_pytorch_the_driver_names_the_failing_allocator(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(tmp_path))  # no torch importable from here
    (tmp_path / "torch.py").write_text("raise ImportError('no torch in this test')\n")
    p = subprocess.run(
        [sys.executable, SCRIPT, "--allocators", "caching", "--turns", "1"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert p.returncode != 0
    assert "caching: the child failed" in p.stderr
    assert "no torch in this test" in p.stderr

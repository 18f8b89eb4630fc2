"""xlog_cuda.numba, Numba's External Memory Management plug-in, without a
GPU: on the sim backend, through a stand-in for Numba (tests/fake_numba,
the EMM surface of numba-cuda) and, where numba-cuda is installed, through
the real base classes. Each case runs in a fresh interpreter: Numba's
memory manager and xlog's hook runtimes are per process.

The GPU check (a kernel over xlog-backed arrays) is the `numba` scenario
of scripts/gpu-frameworks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHON_DIR

FAKE_NUMBA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_numba")

# Runs with a context of device DEV, made the way this Numba makes one.
SCENARIO = textwrap.dedent(
    r"""
    import ctypes, gc, os, sys, types
    import numba
    import numba.cuda as cuda
    from numba.cuda.cudadrv import driver
    import xlog_cuda, xlog_cuda.interop as xi, xlog_cuda.numba as xn

    DEV = int(os.environ["DEV"])
    BUDGET = 4 << 20  # two 2 MiB pages (the arena's unit); the callers set it
    SIZE = 2400 << 10  # PyTorch's block; twice it does not fit beside `p`
    fake = getattr(numba, "FAKE", False)
    if fake:
        ctx = driver.Context(DEV)          # binds the manager named by NUMBA_CUDA_MEMORY_MANAGER
        mm = ctx.memory_manager
    else:                                  # real numba-cuda, no GPU: no real context
        driver._ensure_memory_manager()
        ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=DEV))
        mm = driver._memory_manager(context=ctx)
        mm.initialize()

    M = xn._numba_memory_manager
    assert type(mm) is M and M is xn.XlogNumbaManager, (type(mm), M)
    assert issubclass(M, cuda.HostOnlyCUDAMemoryManager) and mm.interface_version == 1
    assert M.__module__ == "xlog_cuda.numba" and M.__name__ == "XlogNumbaManager"

    # An array's memory comes from the hook runtime, tagged "numba".
    base = xn.stats(DEV)
    p = mm.memalloc(4096)
    ptr = p.device_pointer_value
    assert ptr and ptr % 256 == 0 and p.size == 4096
    st = xn.stats(DEV)
    assert st.live_bytes - base.live_bytes == 4096 and st.live_blocks - base.live_blocks == 1, st
    # Free is what the budget has left: less what the runtime holds (the
    # pool: the block; the arena: its page).
    assert mm.get_memory_info() == cuda.MemoryInfo(free=BUDGET - st.outstanding_bytes, total=BUDGET)

    # Zero bytes: a NULL pointer, nothing charged, freed like any other.
    z = mm.memalloc(0)
    assert z.size == 0 and not z.device_pointer_value
    assert xn.stats(DEV).live_bytes - base.live_bytes == 4096
    del z

    # One budget with the PyTorch/CuPy hooks of the same device.
    lib = xlog_cuda.load_library()
    t = lib.xlog_torch_malloc(SIZE, DEV, None)
    assert t, xlog_cuda.last_error()
    with_t = xn.stats(DEV)
    t_bytes = with_t.live_bytes - st.live_bytes  # device bytes: SIZE rounded up by the allocator
    assert SIZE <= t_bytes < SIZE + (64 << 10), with_t
    cleared = mm.deallocations.cleared if fake else None
    try:
        mm.memalloc(SIZE)
        raise SystemExit("an allocation over the shared budget succeeded")
    except driver.CudaAPIError as e:
        assert e.code == driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY, e.code
        assert isinstance(e, MemoryError) and isinstance(e, xn.NumbaOutOfMemoryError)
        assert "out of budget" in str(e) and "requested 2457600 bytes" in str(e) and "limit 4194304" in str(e), str(e)
        assert e.xlog_message.startswith("xlog_allocate: out of budget"), e.xlog_message
        if fake:
            assert mm.deallocations.cleared == cleared + 1  # Numba's pending frees flushed before the retry
    assert xn.stats(DEV).failed_allocations >= 1
    lib.xlog_torch_free(t, SIZE, DEV, None)
    st = xn.stats(DEV)
    # PyTorch's block waits in the cache (the arena: its range, in pages
    # still mapped): held and charged, not live.
    assert st.live_bytes - base.live_bytes == 4096 and st.outstanding_bytes == with_t.outstanding_bytes, st
    assert st.cached_bytes - with_t.cached_bytes == t_bytes, st
    hits = st.cache_hits
    q = mm.memalloc(SIZE)                       # fits once PyTorch's block is gone
    assert q.size == SIZE
    st = xn.stats(DEV)
    assert st.live_bytes - base.live_bytes == 4096 + t_bytes, st
    # Both hooks order on the legacy default stream: Numba reuses PyTorch's
    # memory with none new from the driver.
    assert st.cache_hits - hits == 1 and st.outstanding_bytes == with_t.outstanding_bytes, st
    assert st.cached_bytes == with_t.cached_bytes, st
    assert q.device_pointer_value == t, (hex(q.device_pointer_value), hex(t))

    # Dropping the arrays frees their memory (stream-ordered) into the
    # cache: drain retires nothing cached, trim hands it all back.
    del p, q
    gc.collect()
    xi.drain(DEV)
    st = xn.stats(DEV)
    assert st.live_bytes == base.live_bytes and st.pending_bytes == 0, st
    assert st.outstanding_bytes == with_t.outstanding_bytes, st  # all of it still held, idle
    assert st.cached_bytes == st.outstanding_bytes - st.live_bytes, st
    assert xi.trim(DEV) == st.cached_bytes
    st = xn.stats(DEV)
    assert st.cached_bytes == 0 and st.pending_bytes == 0 and st.outstanding_bytes == st.live_bytes, st
    assert mm.get_memory_info() == cuda.MemoryInfo(free=BUDGET - st.outstanding_bytes, total=BUDGET)

    try:
        mm.get_ipc_handle(None)
        raise SystemExit("get_ipc_handle did not refuse")
    except NotImplementedError as e:
        assert "IPC" in str(e)
    mm.reset()
    if fake:
        assert mm.resets == 1
    xi.reap(DEV)
    log = os.environ.get("XLOG_LOG_PATH")
    if log:
        rows = [l.split(",") for l in open(log).read().splitlines()[1:]]
        numba_rows = [(r[2], r[4]) for r in rows if r[6] == "numba"]  # the Tag column
        assert numba_rows.count(("allocate", "4096")) == 1 and ("free", "4096") in numba_rows, numba_rows
    print("SCENARIO OK")
    """
)


# numba-cuda installs a `.pth` file whose import hook (`NumbaCudaFinder` on
# `sys.meta_path`) sends every import of `numba.cuda` to its own copy, ahead
# of any `numba` on PYTHONPATH: a stand-in run takes the hook out first.
NO_REDIRECTOR = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'NumbaCudaFinder']\n"
)


def _run(code: str, tmp_path, fake: bool, **env_extra):
    if fake:
        code = NO_REDIRECTOR + code
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLOG_BUDGET", "XLOG_LOG", "NUMBA_"))}
    env["PYTHONPATH"] = os.pathsep.join(([FAKE_NUMBA] if fake else []) + [PYTHON_DIR])
    env["XLOG_BACKEND"] = "sim"
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))


def _real_numba_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import numba.cuda.cudadrv.driver"], capture_output=True)
    return probe.returncode == 0


def test_module_imports_without_numba(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numba"] = None          # as if Numba were not installed
        import xlog_cuda.numba as xn
        from xlog_cuda.interop import FrameworkMissingError
        for attempt in (lambda: xn.enable(), lambda: xn._numba_memory_manager, lambda: xn.XlogNumbaManager):
            try:
                attempt()
                raise SystemExit("no error without Numba")
            except FrameworkMissingError as e:
                assert "needs Numba (numba-cuda)" in str(e), e
        assert not xn.is_enabled()
        try:
            xn.no_such_name
            raise SystemExit("unknown attribute accepted")
        except AttributeError:
            pass
        print("OK")
        """
    )
    out = _run(code, tmp_path, fake=False)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_env_var_plugin_through_the_numba_stand_in(tmp_path):
    """NUMBA_CUDA_MEMORY_MANAGER=xlog_cuda.numba: the hook runtime opens from
    XLOG_* (budget 4 MiB, a log), Numba's allocations and PyTorch's hook
    share the budget, refusals are Numba's out-of-memory error."""
    log = tmp_path / "numba.csv"
    out = _run(SCENARIO, tmp_path, fake=True, DEV="61", NUMBA_CUDA_MEMORY_MANAGER="xlog_cuda.numba",
               XLOG_BUDGET_BYTES="4MiB", XLOG_LOG_PATH=str(log))
    assert out.returncode == 0 and "SCENARIO OK" in out.stdout, out.stdout + out.stderr


def test_enable_sets_the_memory_manager(tmp_path):
    code = textwrap.dedent(
        """
        import xlog_cuda.numba as xn
        from numba.cuda.cudadrv import driver
        xn.enable(budget="4MiB", backend="sim", device=62)
        assert driver._memory_manager is xn.XlogNumbaManager and xn.is_enabled()
        """
    ) + SCENARIO
    out = _run(code, tmp_path, fake=True, DEV="62")
    assert out.returncode == 0 and "SCENARIO OK" in out.stdout, out.stdout + out.stderr


def test_a_broken_plugin_module_is_numbas_error(tmp_path):
    """A malformed XLOG_* setting fails when Numba first uses the plug-in
    (its context's initialize), with a message naming the variable."""
    code = "from numba.cuda.cudadrv import driver\ndriver.Context(63)\n"
    out = _run(code, tmp_path, fake=True, NUMBA_CUDA_MEMORY_MANAGER="xlog_cuda.numba", XLOG_BUDGET_BYTES="lots")
    assert out.returncode != 0
    assert "XLOG_BUDGET_BYTES" in out.stderr, out.stderr


@pytest.mark.skipif(not _real_numba_available(), reason="numba-cuda is not installed (or cannot import without CUDA libraries)")
def test_with_the_real_numba_cuda(tmp_path):
    out = _run(SCENARIO, tmp_path, fake=False, DEV="64", NUMBA_CUDA_MEMORY_MANAGER="xlog_cuda.numba",
               XLOG_BUDGET_BYTES="4MiB")
    assert out.returncode == 0 and "SCENARIO OK" in out.stdout, out.stdout + out.stderr

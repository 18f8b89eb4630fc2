"""Framework hooks: PyTorch and CuPy allocate through the per-device hook
runtime of libxlog_cuda, so they share one budget, one set of stats and one
log with everything else in the process.

Most code wants the one-call setups in `xlog_cuda.torch` and
`xlog_cuda.cupy` (see docs/frameworks.md). This module is the layer under
them:

    import xlog_cuda.interop as xi
    xi.setup_hooks(0, budget="8GiB")               # before the first allocation
    torch.cuda.memory.change_current_allocator(xi.torch_allocator())
    print(xi.stats(0))

The hook runtime of a device is opened on first use, from the environment
(XLOG_BACKEND, XLOG_BUDGET_BYTES, XLOG_LOG_PATH, XLOG_CACHE,
XLOG_POOL_RELEASE_THRESHOLD) unless `configure` or `setup_hooks` was called
first. Hook runtimes live for the whole process; `trim` gives their cached
memory back to the driver.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import os
import threading
from typing import Any, Dict, List, Optional, Union

from . import _library
from ._config import Backend, Config, SizeLike, _enum_value, _size_value, _threshold_value
from ._config import U64_MAX
from ._errors import InvalidArgumentError, call, call_status, error_for
from ._runtime import I32_MAX, I32_MIN, LiveBlock, Runtime, Stats, TagStats, _checked_int

__all__ = [
    "configure",
    "setup_hooks",
    "hook_config",
    "runtime",
    "stats",
    "reap",
    "drain",
    "trim",
    "live_blocks",
    "live_block_list",
    "tag_stats",
    "reset_peak",
    "memory_summary",
    "record_stream",
    "torch_allocator",
    "cupy_allocator",
    "FrameworkMissingError",
    "import_framework",
]


class FrameworkMissingError(ImportError):
    """PyTorch or CuPy is not importable; raised by the functions that need it."""


def import_framework(name: str, who: str):
    """Import `name` ("torch" or "cupy") for `who`, or raise
    FrameworkMissingError saying what is missing and why."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        pretty = {"torch": "PyTorch", "cupy": "CuPy", "numba.cuda": "Numba (numba-cuda)"}.get(name, name)
        raise FrameworkMissingError(
            f"{who} needs {pretty}, but `import {name}` failed: {e}. Install {pretty} "
            f"(with CUDA support) in this environment; the rest of xlog_cuda works without it."
        ) from e


def _device(device: int) -> int:
    return _checked_int("device", device, I32_MIN, I32_MAX)


def configure(device: int = 0, config: Optional[Config] = None, **overrides: Any) -> None:
    """Set the config of `device`'s hook runtime (`xlog_interop_configure`).

    `config=None` with no overrides means "from the environment" (with
    `wait_on_pressure` on, as for hooks that were never configured). Fails
    with InvalidArgumentError once the hooks of that device are in use.
    """
    device = _device(device)
    lib = _library.load()
    if config is None and not overrides:
        call(lib.xlog_interop_configure, device, None)
        return
    config = dataclasses.replace(config if config is not None else Config.from_env(), **overrides)
    raw = config.to_c()
    call(lib.xlog_interop_configure, device, ctypes.byref(raw))


def runtime(device: int = 0) -> Runtime:
    """A Runtime over `device`'s hook runtime (opened if needed), for stats,
    reap and streams. Closing it drops this reference only.

    Opening it fixes the hook runtime's config: call `setup_hooks` (or
    `xlog_cuda.torch.enable`) before the first `runtime`/`stats` call."""
    device = _device(device)
    handle = ctypes.c_void_p()
    call(_library.load().xlog_interop_runtime, device, ctypes.byref(handle))
    return Runtime._from_handle(handle.value or 0, device)


def stats(device: int = 0) -> Stats:
    """A snapshot of the stats of `device`'s hook runtime: every framework
    and engine allocating through the hooks of that device is in it."""
    with runtime(device) as rt:
        return rt.stats()


def reap(device: int = 0) -> int:
    """Retire the hook runtime's completed frees (never blocks); returns
    the bytes released."""
    with runtime(device) as rt:
        return rt.reap()


def drain(device: int = 0) -> int:
    """Wait for every free the hooks of `device` queued so far, then reap;
    returns the bytes released."""
    with runtime(device) as rt:
        return rt.drain()


def trim(device: int = 0, keep_bytes: int = 0) -> int:
    """Give the cached memory of `device`'s hook runtime back to the driver
    until at most `keep_bytes` stay cached (0: all of it, the role of
    `torch.cuda.empty_cache()`); returns the bytes released
    (`xlog_interop_trim`). Hooks that were never used have nothing cached:
    0, and they are not opened (their config can still be set)."""
    keep_bytes = _checked_int("keep_bytes", keep_bytes, 0, U64_MAX)
    out = ctypes.c_uint64()
    call(_library.load().xlog_interop_trim, _device(device), keep_bytes, ctypes.byref(out))
    return out.value


def live_blocks(device: int = 0) -> int:
    """Blocks the hooks of `device` hold now (0 if never used)."""
    return _library.load().xlog_interop_live_blocks(_device(device))


def live_block_list(device: int = 0) -> List[LiveBlock]:
    """The live blocks of `device`'s hook runtime, oldest first
    (`Runtime.live_blocks`)."""
    with runtime(device) as rt:
        return rt.live_blocks()


def tag_stats(device: int = 0) -> List[TagStats]:
    """Counters per tag of `device`'s hook runtime (`Runtime.tag_stats`)."""
    with runtime(device) as rt:
        return rt.tag_stats()


def reset_peak(device: int = 0) -> None:
    """Restart the peaks of `device`'s hook runtime (`Runtime.reset_peak`)."""
    with runtime(device) as rt:
        rt.reset_peak()


def memory_summary(device: int = 0) -> str:
    """The text summary of `device`'s hook runtime (`Runtime.memory_summary`)."""
    with runtime(device) as rt:
        return rt.memory_summary()


def record_stream(ptr: int, device: int, stream: Optional[int]) -> None:
    """`xlog_torch_record_stream`: the hook block at `ptr` (the pointer the
    malloc hook returned) is used on the native stream `stream` (an int
    `cudaStream_t`; None/0 = the legacy default stream). When the block is
    freed, its allocation stream first waits for the work queued on `stream`
    up to that moment."""
    ptr = _checked_int("ptr", ptr, 0, U64_MAX)
    native = 0 if stream is None else _checked_int("stream", stream, 0, U64_MAX)
    call(_library.load().xlog_torch_record_stream, ptr or None, _device(device), native or None)


# ---------------------------------------------------------------------------
# One-time setup shared by xlog_cuda.torch.enable and xlog_cuda.cupy.enable
# ---------------------------------------------------------------------------


def hook_config(
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    wait_on_pressure: bool = True,
    cache: Optional[bool] = None,
    pool_release_threshold: Optional[SizeLike] = None,
) -> Config:
    """The config `setup_hooks` would give the hooks: the environment
    (XLOG_BACKEND, XLOG_BUDGET_BYTES, XLOG_LOG_PATH, XLOG_CACHE,
    XLOG_POOL_RELEASE_THRESHOLD) with every argument that is not None on
    top. `budget` is a byte count or a size string ("8GiB"); 0 means no
    budget. `cache=False` frees every block to the driver instead of keeping
    it in its stream's cache; `pool_release_threshold` is a byte count, a
    size string or "max". Raises InvalidArgumentError for a bad argument or
    a malformed environment variable."""
    config = Config.from_env()
    if budget is not None:
        config.budget_bytes = _size_value("budget", budget)
    if log_path is not None:
        config.log_path = log_path
    if backend is not None:
        config.backend = backend
    if not isinstance(wait_on_pressure, bool):
        raise InvalidArgumentError(f"wait_on_pressure must be a bool, got {wait_on_pressure!r}")
    config.wait_on_pressure = wait_on_pressure
    if cache is not None:
        if not isinstance(cache, bool):
            raise InvalidArgumentError(f"cache must be a bool, got {cache!r}")
        config.cache = cache
    if pool_release_threshold is not None:
        config.pool_release_threshold = _threshold_value("pool_release_threshold", pool_release_threshold)
    config.to_c()  # validates every field now, with the field's name in the message
    return config


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What `setup_hooks` gave one device's hooks, in comparable form."""

    config: Config
    by: str
    backend: int
    budget: int
    log_path: Optional[bytes]
    wait_on_pressure: bool
    cache: bool
    pool_release_threshold: int


_setup_lock = threading.Lock()
_setups: Dict[int, _Setup] = {}
_atexit_registered = False


def _describe(s: _Setup) -> str:
    backend = {int(b): b.name.lower() for b in Backend}.get(s.backend, str(s.backend))
    log = os.fsdecode(s.log_path) if s.log_path is not None else None
    return (
        f"budget={s.budget}, log_path={log!r}, backend={backend!r}, wait_on_pressure={s.wait_on_pressure}, "
        f"cache={s.cache}, pool_release_threshold={s.pool_release_threshold}"
    )


def setup_hooks(
    device: int = 0,
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    wait_on_pressure: bool = True,
    *,
    cache: Optional[bool] = None,
    pool_release_threshold: Optional[SizeLike] = None,
    by: str = "setup_hooks",
) -> Config:
    """Configure `device`'s hook runtime (see `hook_config`) and open it
    now, so that a bad config (an unwritable log path, no CUDA device for
    backend='cuda') fails here instead of as a NULL from the malloc hook.
    Returns the config in force.

    Calling it again for the same device is fine: arguments left None keep
    what the first call set (so `xlog_cuda.cupy.enable()` joins the budget
    `xlog_cuda.torch.enable(budget=...)` set), and arguments that contradict
    it raise InvalidArgumentError, since a hook runtime cannot be
    reconfigured once open. If the hooks of `device` are already in use
    without a setup (they opened from the environment on first use), a call
    without arguments accepts that; one with arguments is refused.
    `by` names the caller in messages.
    """
    global _atexit_registered
    device = _device(device)
    with _setup_lock:
        previous = _setups.get(device)
        if previous is not None:
            conflicts: List[str] = []
            if budget is not None and _size_value("budget", budget) != previous.budget:
                conflicts.append(f"budget {_size_value('budget', budget)} != {previous.budget}")
            if log_path is not None and os.fsencode(log_path) != previous.log_path:
                before = os.fsdecode(previous.log_path) if previous.log_path is not None else None
                conflicts.append(f"log_path {os.fsdecode(log_path)!r} != {before!r}")
            if backend is not None and _enum_value("backend", Backend, backend) != previous.backend:
                conflicts.append(f"backend {backend!r} differs")
            if bool(wait_on_pressure) != previous.wait_on_pressure:
                conflicts.append(f"wait_on_pressure {wait_on_pressure} != {previous.wait_on_pressure}")
            if cache is not None and bool(cache) != previous.cache:
                conflicts.append(f"cache {cache} != {previous.cache}")
            if pool_release_threshold is not None:
                wanted = _threshold_value("pool_release_threshold", pool_release_threshold)
                if wanted != previous.pool_release_threshold:
                    conflicts.append(f"pool_release_threshold {wanted} != {previous.pool_release_threshold}")
            if conflicts:
                raise InvalidArgumentError(
                    f"{by}: the hooks of device {device} were already set up by {previous.by} "
                    f"({_describe(previous)}) and cannot be reconfigured in this process: "
                    + "; ".join(conflicts)
                )
            return previous.config

        config = hook_config(budget, log_path, backend, wait_on_pressure, cache, pool_release_threshold)
        raw = config.to_c()
        lib = _library.load()
        status, message = call_status(lib.xlog_interop_configure, device, ctypes.byref(raw))
        if status != 0:
            explicit = any(
                v is not None for v in (budget, log_path, backend, cache, pool_release_threshold)
            )
            if "already in use" in message and not explicit:
                # Opened from the environment before us: join it as it is.
                return Config.from_env()
            if "already in use" in message:
                message += (
                    " (an earlier allocation through the hooks, or a runtime()/stats() call, opened "
                    "them from the environment; set them up before that)"
                )
            raise error_for(status, f"{by}: {message}")
        # Open now: config errors surface here, with their message.
        with runtime(device):
            pass
        _setups[device] = _Setup(
            config=config,
            by=by,
            backend=raw.backend,
            budget=raw.budget_bytes,
            log_path=raw._log_path_bytes,
            wait_on_pressure=bool(raw.wait_on_pressure),
            cache=bool(raw.cache),
            pool_release_threshold=raw.pool_release_threshold,
        )
        if not _atexit_registered:
            atexit.register(_reap_at_exit)
            _atexit_registered = True
        return config


def _reap_at_exit() -> None:
    """Hook runtimes live until the process ends and are never closed.
    Their CSV log needs no flush (each row is written as it is made); reap
    once more at exit so that it also has the `retire` rows of the frees
    complete by then."""
    with _setup_lock:
        devices = list(_setups)
    for device in devices:
        try:
            reap(device)
        except Exception:  # noqa: BLE001 - never fail interpreter exit
            pass


# ---------------------------------------------------------------------------
# Allocator objects
# ---------------------------------------------------------------------------


def torch_allocator():
    """A `torch.cuda.memory.CUDAPluggableAllocator` over the hooks.

    It loads this same libxlog_cuda file (`library_path()`), so the process
    has one copy of the hook state."""
    import torch  # imported here: torch is optional

    return torch.cuda.memory.CUDAPluggableAllocator(
        _library.library_path(), "xlog_torch_malloc", "xlog_torch_free"
    )


def hook_address(name: str) -> int:
    """The address of an exported hook function (for C-level allocators)."""
    lib = _library.load()
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def cupy_allocator():
    """A `cupy.cuda.memory.CFunctionAllocator` over the hooks. Note that
    CuPy does not check the pointer it gets back: a refused allocation gives
    a MemoryPointer at address 0 instead of an exception. Use
    `xlog_cuda.cupy.enable()`, which checks and raises."""
    import cupy  # imported here: cupy is optional

    # `owner` (the CDLL) keeps the library mapped while CuPy holds the pointers.
    return cupy.cuda.memory.CFunctionAllocator(
        0, hook_address("xlog_cupy_malloc"), hook_address("xlog_cupy_free"), _library.load()
    )

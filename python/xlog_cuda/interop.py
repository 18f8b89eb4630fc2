"""Framework hooks: PyTorch and CuPy allocate through the per-device hook
runtime of libxlog_cuda, so they share one budget, one set of stats and one
log with everything else in the process.

    import xlog_cuda.interop as xi
    xi.configure(0, budget_bytes="8GiB")          # before the first allocation
    torch.cuda.memory.change_current_allocator(xi.torch_allocator())

The hook runtime of a device is opened on first use, from the environment
(XLOG_BACKEND, XLOG_BUDGET_BYTES, XLOG_LOG_PATH) unless `configure` was
called first.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Optional

from . import _library
from ._config import Config
from ._errors import check
from ._runtime import I32_MAX, I32_MIN, Runtime, _checked_int

__all__ = ["configure", "runtime", "live_blocks", "torch_allocator", "cupy_allocator"]


def configure(device: int = 0, config: Optional[Config] = None, **overrides: Any) -> None:
    """Set the config of `device`'s hook runtime (`xlog_interop_configure`).

    `config=None` with no overrides means "from the environment". Fails with
    InvalidArgumentError once the hooks of that device have allocated.
    """
    device = _checked_int("device", device, I32_MIN, I32_MAX)
    lib = _library.load()
    if config is None and not overrides:
        check(lib.xlog_interop_configure(device, None))
        return
    config = dataclasses.replace(config if config is not None else Config.from_env(), **overrides)
    raw = config.to_c()
    check(lib.xlog_interop_configure(device, ctypes.byref(raw)))


def runtime(device: int = 0) -> Runtime:
    """A Runtime over `device`'s hook runtime (opened if needed), for stats,
    reap and streams. Closing it drops this reference only."""
    device = _checked_int("device", device, I32_MIN, I32_MAX)
    handle = ctypes.c_void_p()
    check(_library.load().xlog_interop_runtime(device, ctypes.byref(handle)))
    return Runtime._from_handle(handle.value or 0, device)


def live_blocks(device: int = 0) -> int:
    """Blocks the hooks of `device` hold now (0 if never used)."""
    device = _checked_int("device", device, I32_MIN, I32_MAX)
    return _library.load().xlog_interop_live_blocks(device)


def torch_allocator():
    """A `torch.cuda.memory.CUDAPluggableAllocator` over the hooks."""
    import torch  # imported here: torch is optional

    return torch.cuda.memory.CUDAPluggableAllocator(
        _library.library_path(), "xlog_torch_malloc", "xlog_torch_free"
    )


def cupy_allocator():
    """A `cupy.cuda.CFunctionAllocator` over the hooks; use it with
    `cupy.cuda.set_allocator(allocator.malloc)`."""
    import cupy  # imported here: cupy is optional

    lib = _library.load()
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    # `owner` (the CDLL) keeps the library mapped while CuPy holds the pointers.
    return cupy.cuda.CFunctionAllocator(0, address(lib.xlog_cupy_malloc), address(lib.xlog_cupy_free), lib)

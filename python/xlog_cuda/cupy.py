"""CuPy on libxlog_cuda: after `enable()`, CuPy allocates device memory
through the library's hook runtime, under its budget, into its stats and
its log, shared with PyTorch when `xlog_cuda.torch` is enabled too.

    import xlog_cuda.cupy
    xlog_cuda.cupy.enable(budget="8GiB")
    import cupy                                # then use CuPy as usual

CuPy is imported only inside these functions, so this module imports
without it. See docs/frameworks.md.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Callable, Optional, Set, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import last_error
from ._runtime import Stats

__all__ = ["enable", "is_enabled", "stats", "trim"]

_WHO = "xlog_cuda.cupy.enable"


@dataclasses.dataclass
class _Enabled:
    allocator: Any  # cupy.cuda.memory.CFunctionAllocator over the hooks
    malloc: Callable[[int], Any]  # what was given to cupy.cuda.set_allocator
    devices: Set[int]


_lock = threading.Lock()
_state: Optional[_Enabled] = None


def _checked_malloc(cupy: Any, allocator: Any) -> Callable[[int], Any]:
    """CuPy's allocator callable over `allocator`, raising on refusal.

    CuPy's CFunctionAllocator does not look at the pointer the C function
    returns, so a refused allocation would become a MemoryPointer at
    address 0. This wrapper turns it into cupy.cuda.memory.OutOfMemoryError
    (what CuPy's own pool raises), with the library's reason appended.
    """
    out_of_memory = cupy.cuda.memory.OutOfMemoryError

    def malloc(size: int):
        memptr = allocator.malloc(size)
        if size > 0 and not memptr.ptr:
            reason = last_error()  # first: any later library call replaces it
            device = cupy.cuda.runtime.getDevice()
            try:
                now = interop.stats(device)
                live, limit = now.live_bytes, now.budget_limit
            except Exception:  # noqa: BLE001 - the reason matters more than the numbers
                live, limit = 0, 0
            error = out_of_memory(size, live, limit)
            error.args = (f"{error.args[0] if error.args else ''} [xlog: {reason or 'allocation refused'}]",)
            error.xlog_message = reason
            raise error
        return memptr

    malloc.xlog_allocator = allocator  # type: ignore[attr-defined]
    return malloc


def enable(
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    device: int = 0,
    wait_on_pressure: bool = True,
    cache: Optional[bool] = None,
    pool_release_threshold: Optional[SizeLike] = None,
) -> None:
    """Make CuPy allocate through libxlog_cuda (`cupy.cuda.set_allocator`).

    The arguments configure the hook runtime of `device` exactly as in
    `xlog_cuda.torch.enable`; left None they come from the environment, or
    from an earlier `xlog_cuda.torch.enable` for the same device (the two
    then share one budget). CuPy's allocator is process-wide: allocations on
    other devices go to those devices' hook runtimes (configured from the
    environment unless set up too). Arrays CuPy allocated before the call
    stay in CuPy's pool and are not counted.

    A refused allocation raises cupy.cuda.memory.OutOfMemoryError whose
    message ends with the library's reason ("[xlog: out of budget: ...]").
    Idempotent; raises FrameworkMissingError (an ImportError) without CuPy.
    """
    global _state
    cupy = interop.import_framework("cupy", _WHO)
    with _lock:
        interop.setup_hooks(
            device, budget, log_path, backend, wait_on_pressure,
            cache=cache, pool_release_threshold=pool_release_threshold, by=_WHO,
        )
        if _state is not None:
            _state.devices.add(device)
            current = getattr(cupy.cuda, "get_allocator", None)
            if current is None or current() is not _state.malloc:
                # Another allocator was set since (or we cannot tell): ours again.
                cupy.cuda.set_allocator(_state.malloc)
            return
        allocator = cupy.cuda.memory.CFunctionAllocator(
            0,
            interop.hook_address("xlog_cupy_malloc"),
            interop.hook_address("xlog_cupy_free"),
            # Keeps the library mapped while CuPy holds the function pointers.
            _library.load(),
        )
        malloc = _checked_malloc(cupy, allocator)
        cupy.cuda.set_allocator(malloc)
        _state = _Enabled(allocator=allocator, malloc=malloc, devices={device})


def is_enabled() -> bool:
    """Whether `enable()` has installed the allocator in this process."""
    return _state is not None


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime, shared with PyTorch (through
    `xlog_cuda.torch`) and any other user of the hooks of this device."""
    return interop.stats(device)


def trim(device: int = 0, keep_bytes: int = 0) -> int:
    """Give the memory cached by `device`'s hook runtime back to the driver,
    keeping at most `keep_bytes` cached; returns the bytes released (what
    `cupy.get_default_memory_pool().free_all_blocks()` is for CuPy's own
    pool). Shared with PyTorch through the same hooks; 0 if never used."""
    return interop.trim(device, keep_bytes)

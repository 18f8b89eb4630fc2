"""RMM (the RAPIDS Memory Manager) on libxlog_cuda, for RAPIDS Python users.

After `enable()`, whatever allocates through RMM's current device resource
(`rmm.DeviceBuffer`, cuDF, cuML, cuGraph, CuPy with RMM's allocator, Numba
with RMM's EMM plugin) takes its memory from the hook runtime of the device,
under its budget, in its stats and its log, shared with PyTorch and CuPy
when `xlog_cuda.torch` / `xlog_cuda.cupy` are enabled too:

    import xlog_cuda.rmm
    xlog_cuda.rmm.enable(budget="8GiB")
    import cudf                                # then use RAPIDS as usual

The resource is an `rmm.mr.CallbackMemoryResource` over the same C hooks
PyTorch uses (`xlog_torch_malloc` / `xlog_torch_free`), called through
ctypes: RMM calls back into Python for every allocation and free, which
costs a few microseconds a pair (docs/frameworks.md has the figure measured
on the GPU machine). For per-allocation speed from C++, use
`include/xlog/mr.hpp` instead, which RMM calls directly.

What the resource does with RMM's streams: an allocation is made on the
stream RMM passes (imported into xlog on first sight); a free on another
stream than the allocation's first records a use of the block on that
stream, so the memory is not reused before the work queued there.

A refusal raises xlog's OutOfBudgetError / OutOfMemoryError (both
MemoryErrors): RMM turns a MemoryError raised in the callback into
`rmm::out_of_memory` in C++, and that comes back to Python callers as a
MemoryError carrying xlog's message.

RMM is imported only inside these functions, so this module imports
without it. See docs/frameworks.md.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from typing import Any, Dict, Optional, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import Status, error_for, last_error
from ._runtime import Stats

__all__ = ["enable", "disable", "resource", "is_enabled", "stats", "trim"]

_WHO = "xlog_cuda.rmm"


def _stream_handle(stream: Any) -> int:
    """The cudaStream_t of an RMM Stream (or anything with the CUDA stream
    protocol), as an int; 0 is the legacy default stream."""
    if stream is None:
        return 0
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None:
        raise TypeError(f"{_WHO}: expected an RMM Stream, got {type(stream).__name__}")
    return int(protocol()[1])


class _Hooks:
    """The allocate/free pair handed to `rmm.mr.CallbackMemoryResource` for
    one device. It remembers the stream of each live pointer, because RMM
    gives a free only the pointer, its size and the stream of the free."""

    def __init__(self, device: int):
        lib = _library.load()
        self.device = device
        self._malloc = lib.xlog_torch_malloc
        self._free = lib.xlog_torch_free
        self._record = lib.xlog_torch_record_stream
        self._streams: Dict[int, int] = {}
        self._lock = threading.Lock()

    def allocate(self, size: int, stream: Any) -> int:
        if size == 0:
            return 0
        native = _stream_handle(stream)
        ptr = self._malloc(size, self.device, native or None)
        if not ptr:
            raise _refusal(last_error(), size)
        with self._lock:
            self._streams[ptr] = native
        return ptr

    def deallocate(self, ptr: int, size: int, stream: Any) -> None:
        if not ptr:
            return
        native = _stream_handle(stream)
        with self._lock:
            allocated_on = self._streams.pop(ptr, None)
        if allocated_on is not None and allocated_on != native:
            # The free's stream may still have work on the memory: order the
            # free after it (a failure leaves the free ordered on the
            # allocation stream alone, as mr.hpp does; a free cannot fail).
            self._record(ptr, self.device, native or None)
        self._free(ptr, size, self.device, native or None)


def _refusal(message: str, size: int) -> Exception:
    """The exception for a NULL from the malloc hook, from its message (the
    hooks return a pointer, not a status): the library's refusals begin
    "out of budget" and "out of device memory" (src/error.rs)."""
    if "out of budget" in message:
        status = Status.OUT_OF_BUDGET
    elif "out of device memory" in message:
        status = Status.OUT_OF_MEMORY
    else:
        status = Status.INTERNAL
    return error_for(status, message or f"{_WHO}: allocation of {size} bytes refused (no message)")


@dataclasses.dataclass
class _Enabled:
    resource: Any  # what enable() made RMM's resource
    previous: Any  # the resource it replaced (disable() puts it back)


_lock = threading.Lock()
_enabled: Dict[int, _Enabled] = {}


def resource(
    device: int = 0,
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    wait_on_pressure: bool = True,
) -> Any:
    """An `rmm.mr.CallbackMemoryResource` that allocates from `device`'s
    hook runtime, configured as in `xlog_cuda.torch.enable` (the arguments
    left None come from the environment, or from an earlier enable of any
    framework on the same device: they then share one budget). Use it where
    RMM takes a resource (`rmm.mr.set_per_device_resource`, an adaptor's
    upstream); `enable()` makes it the current device resource."""
    rmm = interop.import_framework("rmm", _WHO)
    interop.setup_hooks(device, budget, log_path, backend, wait_on_pressure, by=_WHO)
    hooks = _Hooks(device)
    return _resource_class(rmm)(hooks)


@functools.lru_cache(maxsize=None)
def _resource_class(rmm: Any) -> type:
    """CallbackMemoryResource with the hooks as an attribute (`xlog_hooks`;
    RMM's class is a Cython type without a __dict__), made once."""

    class XlogMemoryResource(rmm.mr.CallbackMemoryResource):
        """RMM's CallbackMemoryResource over xlog's hooks (xlog_cuda.rmm)."""

        def __init__(self, hooks: _Hooks):
            super().__init__(hooks.allocate, hooks.deallocate)
            self.xlog_hooks = hooks

        def __repr__(self) -> str:
            return f"<xlog_cuda.rmm resource on device {self.xlog_hooks.device}>"

    return XlogMemoryResource


def enable(
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    device: int = 0,
    wait_on_pressure: bool = True,
) -> Any:
    """Make xlog RMM's resource for `device` (`rmm.mr.set_per_device_resource`)
    and return it. Buffers RMM allocated before stay with the resource that
    made them. Idempotent per device; `disable(device)` puts the previous
    resource back. Raises FrameworkMissingError (an ImportError) without RMM."""
    rmm = interop.import_framework("rmm", _WHO)
    with _lock:
        state = _enabled.get(device)
        if state is not None:
            if rmm.mr.get_per_device_resource(device) is not state.resource:
                rmm.mr.set_per_device_resource(device, state.resource)
            return state.resource
        mr = resource(device, budget, log_path, backend, wait_on_pressure)
        previous = rmm.mr.get_per_device_resource(device)
        rmm.mr.set_per_device_resource(device, mr)
        _enabled[device] = _Enabled(mr, previous)
        return mr


def disable(device: int = 0) -> None:
    """Put back the resource RMM had for `device` before `enable()`. Buffers
    xlog allocated stay valid (the resource lives while they do) and go
    back to xlog when freed."""
    rmm = interop.import_framework("rmm", _WHO)
    with _lock:
        state = _enabled.pop(device, None)
        if state is not None:
            rmm.mr.set_per_device_resource(device, state.previous)


def is_enabled(device: int = 0) -> bool:
    """Whether `enable()` made xlog RMM's resource for `device`."""
    return device in _enabled


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime (shared with the other frameworks'
    hooks on that device)."""
    return interop.stats(device)


def trim(device: int = 0, keep_bytes: int = 0) -> int:
    """Give idle memory of `device`'s hook runtime back to the driver; the
    bytes released."""
    return interop.trim(device, keep_bytes)

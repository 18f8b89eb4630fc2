"""PyTorch on libxlog_cuda: after `enable()`, every CUDA allocation PyTorch
makes goes through the library's hook runtime, under its budget, into its
stats and its log.

    import xlog_cuda.torch
    xlog_cuda.torch.enable(budget="8GiB")      # first, before any CUDA work
    import torch                               # then use PyTorch as usual

PyTorch itself is imported only inside these functions, so this module
imports (and the rest of xlog_cuda works) without it. See
docs/frameworks.md for what changes and what does not.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Optional, Set, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import InvalidArgumentError
from ._runtime import Stats

__all__ = ["enable", "is_enabled", "stats", "record_stream"]

_WHO = "xlog_cuda.torch.enable"


@dataclasses.dataclass
class _Enabled:
    allocator: Any  # the CUDAPluggableAllocator; kept alive with the process
    library: str
    devices: Set[int]


_lock = threading.Lock()
_state: Optional[_Enabled] = None


def _torch(who: str):
    return interop.import_framework("torch", who)


def enable(
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    device: int = 0,
    wait_on_pressure: bool = True,
) -> None:
    """Route PyTorch's CUDA allocations through libxlog_cuda.

    `budget` (bytes, or a size string such as "8GiB"; 0 = none), `log_path`
    (a CSV log of every allocate/free; "" = none) and `backend` ('auto', 'cuda', 'sim')
    configure the hook runtime of `device`; each one left None comes from
    XLOG_BUDGET_BYTES / XLOG_LOG_PATH / XLOG_BACKEND. With
    `wait_on_pressure`, an allocation over budget first waits for frees
    still in flight on the GPU before it is refused.

    Must run before PyTorch initialises CUDA in this process (PyTorch cannot
    swap allocators afterwards): RuntimeError otherwise, and nothing is
    changed. Calling it again is harmless; a second call may set up another
    device's hooks, but may not change a device's settings
    (InvalidArgumentError). Raises FrameworkMissingError (an ImportError)
    without PyTorch.
    """
    global _state
    torch = _torch(_WHO)
    with _lock:
        if _state is not None:
            interop.setup_hooks(device, budget, log_path, backend, wait_on_pressure, by=_WHO)
            _state.devices.add(device)
            return
        if torch.cuda.is_initialized():
            raise RuntimeError(
                f"{_WHO}: PyTorch has already initialised CUDA in this process, and with it its own "
                "caching allocator, which cannot be swapped afterwards. Call enable() first, before "
                "any CUDA tensor, model or torch.cuda call (at the top of the main script)."
            )
        interop.setup_hooks(device, budget, log_path, backend, wait_on_pressure, by=_WHO)
        path = _library.library_path()
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "xlog_torch_malloc", "xlog_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(
                f"{_WHO}: PyTorch refused to switch to the xlog allocator ({e}). Some other "
                "allocator is in place already (another pluggable allocator, or PyTorch's own after "
                "CUDA memory was used); call enable() before anything else touches CUDA."
            ) from e
        _state = _Enabled(allocator=allocator, library=path, devices={device})


def is_enabled() -> bool:
    """Whether `enable()` has installed the allocator in this process."""
    return _state is not None


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime. It is shared: CuPy (through
    `xlog_cuda.cupy`) and any other user of the hooks of this device are
    counted in it too. Opens the hook runtime if nothing has yet."""
    return interop.stats(device)


def record_stream(tensor: Any, stream: Any) -> None:
    """Tell the allocator that `tensor`'s memory is used on `stream` (a
    `torch.cuda.Stream`, or a raw `cudaStream_t` as an int).

    The role of `Tensor.record_stream`, which does not reach a pluggable
    allocator: PyTorch's CUDAPluggableAllocator has no record-stream hook
    from Python. When the tensor's memory is freed, its allocation stream
    first waits for the work queued on `stream` up to that moment. Either
    call this for a tensor used on a stream other than the one it was
    created on, or synchronize that stream before the tensor dies.
    """
    torch = _torch("xlog_cuda.torch.record_stream")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda":
        raise InvalidArgumentError(f"record_stream needs a CUDA tensor, this one is on {tensor.device}")
    # The allocation's base pointer: a view's data_ptr() may be offset into it.
    ptr = tensor.untyped_storage().data_ptr()
    if ptr == 0:
        return  # no memory behind it, nothing to protect
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    if isinstance(stream, int) and not isinstance(stream, bool):
        native = stream
    elif hasattr(stream, "cuda_stream"):
        native = stream.cuda_stream
    else:
        raise TypeError(f"expected a torch.cuda.Stream or an int cudaStream_t, got {type(stream).__name__}")
    interop.record_stream(ptr, device, native)

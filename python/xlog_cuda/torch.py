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

import ctypes
import dataclasses
import os
import threading
import warnings
from typing import Any, Optional, Set, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import InvalidArgumentError
from ._runtime import Stats

__all__ = ["enable", "is_enabled", "stats", "trim", "record_stream", "oom_shim"]

_WHO = "xlog_cuda.torch.enable"


@dataclasses.dataclass
class _Enabled:
    allocator: Any  # the CUDAPluggableAllocator; kept alive with the process
    library: str
    devices: Set[int]
    # The OOM shim's path, or None with the reason it is not in use.
    shim: Optional[str]
    shim_problem: str


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
    cache: Optional[bool] = None,
    pool_release_threshold: Optional[SizeLike] = None,
) -> None:
    """Route PyTorch's CUDA allocations through libxlog_cuda.

    `budget` (bytes, or a size string such as "8GiB"; 0 = none), `log_path`
    (a CSV log of every allocate/free; "" = none), `backend` ('auto', 'cuda',
    'sim'), `cache` (keep freed blocks per stream for reuse; default on) and
    `pool_release_threshold` (bytes, a size string or "max") configure the
    hook runtime of `device`; each one left None comes from
    XLOG_BUDGET_BYTES / XLOG_LOG_PATH / XLOG_BACKEND / XLOG_CACHE /
    XLOG_POOL_RELEASE_THRESHOLD. With `wait_on_pressure`, an allocation over
    budget first waits for frees still in flight on the GPU before it is
    refused. `trim()` gives cached memory back (the role of
    `torch.cuda.empty_cache()`).

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
            interop.setup_hooks(
                device, budget, log_path, backend, wait_on_pressure,
                cache=cache, pool_release_threshold=pool_release_threshold, by=_WHO,
            )
            _state.devices.add(device)
            return
        if torch.cuda.is_initialized():
            raise RuntimeError(
                f"{_WHO}: PyTorch has already initialised CUDA in this process, and with it its own "
                "caching allocator, which cannot be swapped afterwards. Call enable() first, before "
                "any CUDA tensor, model or torch.cuda call (at the top of the main script)."
            )
        interop.setup_hooks(
            device, budget, log_path, backend, wait_on_pressure,
            cache=cache, pool_release_threshold=pool_release_threshold, by=_WHO,
        )
        path = _library.library_path()
        shim, problem = _oom_shim(torch)
        if shim is not None:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(shim, "xlog_shim_torch_malloc", "xlog_shim_torch_free")
        else:
            warnings.warn(
                f"{_WHO}: without the OOM shim ({problem}) a refused allocation reaches PyTorch as a NULL "
                "it does not check (pytorch/pytorch#133280): the tensor gets data_ptr() 0 instead of "
                "torch.OutOfMemoryError being raised. Check xlog_cuda.last_error() or stats().failed_allocations.",
                RuntimeWarning,
                stacklevel=2,
            )
            allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "xlog_torch_malloc", "xlog_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(
                f"{_WHO}: PyTorch refused to switch to the xlog allocator ({e}). Some other "
                "allocator is in place already (another pluggable allocator, or PyTorch's own after "
                "CUDA memory was used); call enable() before anything else touches CUDA."
            ) from e
        _state = _Enabled(allocator=allocator, library=path, devices={device}, shim=shim, shim_problem=problem)


_SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_oom_shim.cpp")


def _oom_shim(torch) -> "tuple[Optional[str], str]":
    """Build (once per PyTorch version, cached) and bind the shim that turns
    a refused allocation into torch.OutOfMemoryError; (path, "") or (None,
    why not). XLOG_TORCH_OOM_SHIM=0 turns it off."""
    if os.environ.get("XLOG_TORCH_OOM_SHIM", "1") == "0":
        return None, "XLOG_TORCH_OOM_SHIM=0"
    try:
        from torch.utils import cpp_extension

        tag = "".join(c if c.isalnum() else "_" for c in torch.__version__)
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        build = os.path.join(cache, "xlog_cuda", f"torch_oom_shim_{tag}")
        os.makedirs(build, exist_ok=True)
        name = "xlog_torch_oom_shim"
        cpp_extension.load(name=name, sources=[_SHIM_SOURCE], build_directory=build,
                           is_python_module=False, verbose=False)
        shim = os.path.join(build, name + ".so")
        lib = _library.load()
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        handle = ctypes.CDLL(shim)
        handle.xlog_shim_bind.argtypes = [ctypes.c_void_p] * 2
        handle.xlog_shim_bind.restype = None
        handle.xlog_shim_bind(addr(lib.xlog_torch_malloc), addr(lib.xlog_torch_free))
        return shim, ""
    except Exception as e:  # noqa: BLE001 - any build problem falls back, with the reason
        return None, f"building it failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"


def oom_shim() -> str:
    """How refused allocations reach PyTorch: "torch.OutOfMemoryError (shim
    PATH)" or why the shim is not in use (then PyTorch gets an unchecked
    NULL). Empty before `enable()`."""
    if _state is None:
        return ""
    if _state.shim is not None:
        return f"torch.OutOfMemoryError (shim {_state.shim})"
    return f"no shim: {_state.shim_problem}"


def is_enabled() -> bool:
    """Whether `enable()` has installed the allocator in this process."""
    return _state is not None


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime. It is shared: CuPy (through
    `xlog_cuda.cupy`) and any other user of the hooks of this device are
    counted in it too. Opens the hook runtime if nothing has yet."""
    return interop.stats(device)


def trim(device: int = 0, keep_bytes: int = 0) -> int:
    """Give the memory cached by `device`'s hook runtime back to the driver,
    keeping at most `keep_bytes` cached; returns the bytes released. The
    counterpart of `torch.cuda.empty_cache()`, which does not reach a
    pluggable allocator. The hook runtime is shared, so blocks CuPy freed
    through the hooks of `device` are released too. PyTorch is not needed;
    0 if the hooks were never used."""
    return interop.trim(device, keep_bytes)


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

"""Numba on libxlog_cuda: an External Memory Management (EMM) plug-in, so
that Numba's device arrays are allocated by the hook runtime of their
device, under the same budget, in the same stats and the same CSV log as
PyTorch (`xlog_cuda.torch`) and CuPy (`xlog_cuda.cupy`).

Either, before Numba creates its CUDA context (its first CUDA call):

    import xlog_cuda.numba
    xlog_cuda.numba.enable(budget="8GiB")      # numba.cuda.set_memory_manager(...)

or, with no code change, from the environment (budget and log from
XLOG_BUDGET_BYTES / XLOG_LOG_PATH, or from an earlier torch/cupy enable()):

    NUMBA_CUDA_MEMORY_MANAGER=xlog_cuda.numba python app.py

Numba is imported only inside these functions (the class is built the
first time it is asked for), so this module imports without Numba. See
docs/frameworks.md.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from typing import Any, Dict, Optional, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import Status, error_for, last_error
from ._runtime import Stats

__all__ = ["enable", "is_enabled", "stats", "XlogNumbaManager", "NumbaOutOfMemoryError"]

_WHO = "xlog_cuda.numba"
TAG = b"numba"
# Reap (never blocking) after this many frees, as the C hooks do, so that
# pending bytes do not pile up between budget-pressure reaps.
_REAP_EVERY = 32


def _numba_cuda():
    return interop.import_framework("numba.cuda", _WHO)


class _DeviceHooks:
    """This process's handle to the hook runtime of one device, and the
    stream Numba's memory is ordered on."""

    def __init__(self, device: int):
        lib = _library.load()
        handle = ctypes.c_void_p()
        status = lib.xlog_interop_runtime(device, ctypes.byref(handle))
        if status != 0:
            raise error_for(status, f"{_WHO}: {last_error()}")
        stream = ctypes.c_uint32()
        # Numba's allocation interface has no stream: memory must be usable
        # on any stream, as cuMemAlloc's is. Blocks are ordered on the
        # legacy default stream, which Numba's streams (cuda.stream(),
        # blocking) synchronise with, so a free waits for work queued on
        # them before it; a stream made non-blocking needs a synchronize
        # before its arrays die (the same rule as for CuPy).
        status = lib.xlog_stream_import(handle, None, ctypes.byref(stream))
        if status != 0:
            raise error_for(status, f"{_WHO}: importing the legacy default stream: {last_error()}")
        self.lib = lib
        self.runtime = handle  # never closed: hook runtimes live for the process
        self.stream = stream.value
        self.device = device
        self.frees = 0
        self.lock = threading.Lock()

    def allocate(self, size: int) -> "_library.XlogBlock":
        block = _library.XlogBlock()
        status = self.lib.xlog_allocate(self.runtime, size, self.stream, TAG, ctypes.byref(block))
        if status != 0:
            return status, last_error()  # type: ignore[return-value]
        return block

    def free(self, block: "_library.XlogBlock") -> None:
        status = self.lib.xlog_deallocate(self.runtime, block)
        if status != 0:
            # A finalizer must not raise: say it on stderr, as the C hooks do.
            print(f"xlog: {_WHO}: freeing {block.size} bytes at {block.ptr or 0:#x}: {last_error()}", file=sys.stderr)
            return
        with self.lock:
            self.frees += 1
            reap = self.frees % _REAP_EVERY == 0
        if reap:
            self.lib.xlog_reap(self.runtime, None)

    def reap(self) -> None:
        self.lib.xlog_reap(self.runtime, None)


_devices_lock = threading.Lock()
_devices: Dict[int, _DeviceHooks] = {}
_enabled = False


def _hooks(device: int) -> _DeviceHooks:
    with _devices_lock:
        hooks = _devices.get(device)
        if hooks is None:
            # Join what torch/cupy enable() set up for this device, else
            # open from the environment (wait_on_pressure on).
            interop.setup_hooks(device, by=_WHO)
            hooks = _devices[device] = _DeviceHooks(device)
        return hooks


def _free_finalizer(hooks: _DeviceHooks, block: "_library.XlogBlock"):
    def finalize() -> None:
        hooks.free(block)

    return finalize


# ---------------------------------------------------------------------------
# The plug-in class, built against the installed Numba on first use
# ---------------------------------------------------------------------------

_classes: Dict[str, Any] = {}
_classes_lock = threading.Lock()


def _build_classes() -> Dict[str, Any]:
    with _classes_lock:
        if _classes:
            return _classes
        cuda = _numba_cuda()
        from numba.cuda.cudadrv import driver as nb_driver

        oom_code = _oom_code(nb_driver)

        class NumbaOutOfMemoryError(nb_driver.CudaAPIError, MemoryError):
            """Numba's out-of-memory error (a CudaAPIError with code
            CUDA_ERROR_OUT_OF_MEMORY, what Numba raises when cuMemAlloc
            fails), raised when xlog refuses an allocation. Its message
            is xlog's reason; `xlog_message` and `xlog_status` hold them."""

            def __init__(self, code, msg, xlog_message: str = "", xlog_status: int = 0):
                super().__init__(code, msg)
                self.xlog_message = xlog_message
                self.xlog_status = xlog_status

        class XlogNumbaManager(cuda.HostOnlyCUDAMemoryManager):
            """Numba EMM plug-in over libxlog_cuda's hook runtime of the
            context's device. Device memory comes from xlog (tag "numba");
            pinned and mapped host memory stay Numba's own
            (HostOnlyCUDAMemoryManager).

            - A refused allocation raises NumbaOutOfMemoryError (Numba's
              CudaAPIError with CUDA_ERROR_OUT_OF_MEMORY) carrying xlog's
              message ("... out of budget: requested N bytes, ...").
              Before refusing, xlog reaps and (wait_on_pressure) waits for
              frees in flight; this plug-in also collects Python garbage
              once and retries, so arrays in unreachable cycles do not
              hold the budget.
            - A freed array's memory goes back to xlog at once (stream-
              ordered on the legacy default stream): defer_cleanup() defers
              only Numba's host-side frees.
            - get_memory_info(): the budget (free = remaining, total =
              limit); without a budget, the device's, from the driver.
            - get_ipc_handle(): not supported (xlog's memory comes from a
              stream-ordered pool that is not set up for IPC export).
            """

            def __init__(self, *args, **kwargs):
                # Numba also builds one with context=None, only to read
                # interface_version: nothing here may touch the context.
                super().__init__(*args, **kwargs)
                self._xlog: Optional[_DeviceHooks] = None

            def _device(self) -> int:
                device = getattr(getattr(self.context, "device", None), "id", None)
                return 0 if device is None else int(device)

            def initialize(self):
                # Called before the first use in a context, maybe again
                # later: keep what is there.
                if self._xlog is None:
                    self._xlog = _hooks(self._device())

            def memalloc(self, size):
                if self._xlog is None:
                    self.initialize()
                hooks = self._xlog
                got = hooks.allocate(size)
                if isinstance(got, tuple):
                    status, message = got
                    if status in (Status.OUT_OF_BUDGET, Status.OUT_OF_MEMORY):
                        # Numba's own pending frees, then arrays only a
                        # garbage collection would free: then once more.
                        self.deallocations.clear()
                        gc.collect()
                        got = hooks.allocate(size)
                    if isinstance(got, tuple):
                        status, message = got
                        if status in (Status.OUT_OF_BUDGET, Status.OUT_OF_MEMORY):
                            raise NumbaOutOfMemoryError(oom_code, f"xlog refused {size} bytes: {message}",
                                                        message, int(status))
                        raise error_for(status, f"{_WHO}: {message}")
                block = got
                ptr = block.ptr or 0
                return cuda.MemoryPointer(self.context, _device_pointer(nb_driver, ptr), size,
                                          finalizer=_free_finalizer(hooks, block))

            def get_memory_info(self):
                if self._xlog is None:
                    self.initialize()
                st = interop.stats(self._xlog.device)
                if st.budget_limit:
                    return cuda.MemoryInfo(free=st.budget_remaining, total=st.budget_limit)
                try:
                    free, total = nb_driver.driver.cuMemGetInfo()
                except Exception as e:  # noqa: BLE001 - the EMM contract: RuntimeError when unknown
                    raise RuntimeError(f"{_WHO}: no xlog budget is set and the driver's memory info is "
                                       f"unavailable ({e})") from e
                return cuda.MemoryInfo(free=int(free), total=int(total))

            def get_ipc_handle(self, memory):
                raise NotImplementedError(
                    f"{_WHO}: CUDA IPC handles are not supported for xlog memory (it comes from a "
                    "stream-ordered memory pool that is not created for IPC export); copy the data into "
                    "an array allocated by another memory manager to share it between processes"
                )

            def reset(self):
                # Numba's host allocations first (its contract), then retire
                # the frees xlog has in flight. Live arrays stay live: their
                # memory is freed when Numba drops them.
                super().reset()
                if self._xlog is not None:
                    self._xlog.reap()

            @property
            def interface_version(self):
                return 1

        for cls in (XlogNumbaManager, NumbaOutOfMemoryError):
            cls.__module__ = __name__
            cls.__qualname__ = cls.__name__
        _classes.update(XlogNumbaManager=XlogNumbaManager, NumbaOutOfMemoryError=NumbaOutOfMemoryError)
        return _classes


def _oom_code(nb_driver) -> Any:
    """CUDA_ERROR_OUT_OF_MEMORY as this Numba compares it (an enum of the
    NVIDIA bindings in numba-cuda, an int in older Numba)."""
    binding = getattr(nb_driver, "binding", None)
    result = getattr(binding, "CUresult", None)
    if result is not None and hasattr(result, "CUDA_ERROR_OUT_OF_MEMORY"):
        return result.CUDA_ERROR_OUT_OF_MEMORY
    try:
        from numba.cuda.cudadrv import enums

        return enums.CUDA_ERROR_OUT_OF_MEMORY
    except ImportError:
        return 2  # CUDA_ERROR_OUT_OF_MEMORY in cuda.h


def _device_pointer(nb_driver, ptr: int):
    """The pointer in the form this Numba's MemoryPointer takes."""
    if getattr(nb_driver, "USE_NV_BINDING", None) is False:
        return ctypes.c_uint64(ptr)  # older Numba on its ctypes binding
    binding = getattr(nb_driver, "binding", None)
    if binding is not None and hasattr(binding, "CUdeviceptr"):
        return binding.CUdeviceptr(ptr)  # numba-cuda (NVIDIA's bindings); fine for 0 too
    return ctypes.c_void_p(ptr)


def __getattr__(name: str):
    # PEP 562: the plug-in class exists once Numba is importable. Numba's
    # NUMBA_CUDA_MEMORY_MANAGER=xlog_cuda.numba reads _numba_memory_manager.
    if name in ("_numba_memory_manager", "XlogNumbaManager"):
        return _build_classes()["XlogNumbaManager"]
    if name == "NumbaOutOfMemoryError":
        return _build_classes()["NumbaOutOfMemoryError"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------
# One-call setup, as for PyTorch and CuPy
# ---------------------------------------------------------------------------


def enable(
    budget: Optional[SizeLike] = None,
    log_path: Optional[Union[str, os.PathLike]] = None,
    backend: Optional[Union[str, Backend, int]] = None,
    device: int = 0,
    wait_on_pressure: bool = True,
) -> None:
    """Make Numba allocate device memory through libxlog_cuda
    (`numba.cuda.set_memory_manager(XlogNumbaManager)`).

    The arguments configure the hook runtime of `device` as in
    `xlog_cuda.torch.enable`; left None they come from an earlier
    torch/cupy enable() for that device, else from the environment. Call it
    before Numba's first CUDA call: a context Numba created earlier keeps
    its own memory manager. Raises FrameworkMissingError (an ImportError)
    without Numba."""
    global _enabled
    cuda = _numba_cuda()
    interop.setup_hooks(device, budget, log_path, backend, wait_on_pressure, by=_WHO)
    cuda.set_memory_manager(_build_classes()["XlogNumbaManager"])
    _enabled = True


def is_enabled() -> bool:
    """Whether `enable()` ran, or Numba has used the plug-in (for example
    through NUMBA_CUDA_MEMORY_MANAGER) in this process."""
    return _enabled or bool(_devices)


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime: Numba's arrays, and PyTorch's and
    CuPy's allocations through xlog on that device."""
    return interop.stats(device)

"""The parts of numba.cuda.cudadrv.driver an EMM plug-in meets (fake).

Mirrors numba-cuda: the manager class is instantiated once with
context=None by set_memory_manager (to read interface_version, which must
be 1), then once per context; NUMBA_CUDA_MEMORY_MANAGER names a module
whose `_numba_memory_manager` is used, imported when the first context is
made; MemoryPointer calls its finalizer when it is garbage collected;
CudaAPIError carries a code, and the out-of-memory code is
binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY.
"""
import contextlib
import enum
import importlib
import os
import types
import weakref
from abc import ABCMeta, abstractmethod
from collections import namedtuple


class _CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2


binding = types.SimpleNamespace(CUresult=_CUresult)


class CudaDriverError(Exception):
    pass


class CudaAPIError(CudaDriverError):
    def __init__(self, code, msg):
        self.code = code
        self.msg = msg
        super().__init__(code, msg)

    def __str__(self):
        return "[%s] %s" % (self.code, self.msg)


MemoryInfo = namedtuple("MemoryInfo", "free,total")


class BaseCUDAMemoryManager(object, metaclass=ABCMeta):
    def __init__(self, *args, **kwargs):
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")

    @abstractmethod
    def memalloc(self, size): ...

    @abstractmethod
    def memhostalloc(self, size, mapped=False, portable=False, wc=False): ...

    @abstractmethod
    def mempin(self, owner, pointer, size, mapped=False): ...

    @abstractmethod
    def initialize(self): ...

    @abstractmethod
    def get_ipc_handle(self, memory): ...

    @abstractmethod
    def get_memory_info(self): ...

    @abstractmethod
    def reset(self): ...

    @abstractmethod
    def defer_cleanup(self): ...

    @property
    @abstractmethod
    def interface_version(self): ...


class _PendingDeallocs:
    def __init__(self):
        self.cleared = 0

    def clear(self):
        self.cleared += 1


class HostOnlyCUDAMemoryManager(BaseCUDAMemoryManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = {}
        self.deallocations = _PendingDeallocs()
        self.resets = 0

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        raise NotImplementedError("fake")

    def mempin(self, owner, pointer, size, mapped=False):
        raise NotImplementedError("fake")

    def reset(self):
        self.resets += 1
        self.allocations.clear()
        self.deallocations.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        yield


class MemoryPointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        import ctypes

        if isinstance(pointer, ctypes.c_void_p):
            pointer = pointer.value or 0
        self.context = context
        self.device_pointer = pointer
        self.size = size
        self.is_managed = finalizer is not None
        self._owner = owner
        if finalizer is not None:
            self._finalizer = weakref.finalize(self, finalizer)

    @property
    def device_pointer_value(self):
        return int(self.device_pointer) or None

    def free(self):
        if self.is_managed:
            self._finalizer()


_SUPPORTED_EMM_INTERFACE_VERSION = 1
_memory_manager = None


def set_memory_manager(mm_plugin):
    global _memory_manager
    dummy = mm_plugin(context=None)
    if dummy.interface_version != _SUPPORTED_EMM_INTERFACE_VERSION:
        raise RuntimeError("EMM Plugin interface has version %d - version %d required"
                           % (dummy.interface_version, _SUPPORTED_EMM_INTERFACE_VERSION))
    _memory_manager = mm_plugin


def _ensure_memory_manager():
    global _memory_manager
    if _memory_manager:
        return
    name = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
    if name == "default":
        _memory_manager = None
        return
    try:
        module = importlib.import_module(name)
        set_memory_manager(module._numba_memory_manager)
    except Exception:
        raise RuntimeError("Failed to use memory manager from %s" % name)


class Device:
    def __init__(self, device_id):
        self.id = device_id


class Context:
    """What numba makes per device: it binds the memory manager then."""

    def __init__(self, device_id):
        self.device = Device(device_id)
        _ensure_memory_manager()
        self.memory_manager = _memory_manager(context=self)
        self.memory_manager.initialize()

    def memalloc(self, size):
        return self.memory_manager.memalloc(size)

    def get_memory_info(self):
        return self.memory_manager.get_memory_info()

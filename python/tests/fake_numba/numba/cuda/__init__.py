"""numba.cuda's EMM surface (fake; see numba/__init__.py)."""
from .cudadrv.driver import (  # noqa: F401
    BaseCUDAMemoryManager,
    HostOnlyCUDAMemoryManager,
    MemoryInfo,
    MemoryPointer,
    set_memory_manager,
)

"""xlog_cuda: Python bindings (ctypes) for libxlog_cuda, the stream-aware
CUDA device-memory runtime.

    import xlog_cuda as xc

    with xc.Runtime(backend="sim", budget_bytes="64MiB") as rt:
        with rt.acquire_stream() as s, rt.allocate(4096, s, tag="buf") as b:
            xc.launch(rt, s, [(b, xc.Access.WRITE)], lambda: s.enqueue_host(lambda: b.write(b"hi")))
            s.synchronize()

The shared library is found through $XLOG_CUDA_LIBRARY, then the copy a
wheel installed inside this package, then the build trees of this
checkout, then the system loader; see `library_path()`. From a wheel,
`python -m xlog_cuda --cmake-dir` (or `get_cmake_dir()`) gives the CMake
package of that same copy.
"""

from __future__ import annotations

from ._config import Allocator, Backend, Config, parse_size
from ._errors import (
    DriverError,
    HostMemoryError,
    InternalError,
    InvalidArgumentError,
    NoDeviceError,
    OutOfBudgetError,
    OutOfMemoryError,
    PoolExhaustedError,
    Status,
    StreamMisuseError,
    UnsatisfiableDependencyError,
    UseAfterFreeError,
    XlogError,
    error_for,
    last_error,
    status_name,
)
from ._library import LibraryNotFoundError, library_path
from ._paths import get_cmake_dir, get_include_dir, get_lib_dir, get_pkgconfig_dir
from ._library import load as load_library
from ._runtime import (
    Access,
    Block,
    Fault,
    LeakReport,
    LiveBlock,
    Runtime,
    Stats,
    Stream,
    TagStats,
    call_site,
    call_site_summary,
    in_host_callback,
    launch,
)

__all__ = [
    "Access",
    "Allocator",
    "Backend",
    "Block",
    "Config",
    "DriverError",
    "Fault",
    "HostMemoryError",
    "InternalError",
    "InvalidArgumentError",
    "LeakReport",
    "LibraryNotFoundError",
    "LiveBlock",
    "NoDeviceError",
    "OutOfBudgetError",
    "OutOfMemoryError",
    "PoolExhaustedError",
    "Runtime",
    "Stats",
    "Status",
    "Stream",
    "StreamMisuseError",
    "TagStats",
    "UnsatisfiableDependencyError",
    "UseAfterFreeError",
    "XlogError",
    "call_site",
    "call_site_summary",
    "error_for",
    "get_cmake_dir",
    "get_include_dir",
    "get_lib_dir",
    "get_pkgconfig_dir",
    "in_host_callback",
    "last_error",
    "launch",
    "library_path",
    "load_library",
    "parse_size",
    "status_name",
    "version",
]

__version__ = "0.1.0"


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH" (`xlog_version`)."""
    return load_library().xlog_version().decode()

"""Finding and loading libxlog_cuda.so, and the ctypes view of its C ABI.

Everything here mirrors include/xlog_cuda.h one to one: the structures, the
callback type and one prototype per exported function. The tests parse the
header and check this module against it, so a change to the C ABI that is not
carried over here fails loudly instead of corrupting arguments at run time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import List, Optional, Tuple

# --------------------------------------------------------------------------
# C types
# --------------------------------------------------------------------------

# Enumerations cross the boundary as fixed-width integers.
xlog_status = ctypes.c_int32
xlog_backend = ctypes.c_uint32
xlog_allocator = ctypes.c_uint32
xlog_stream = ctypes.c_uint32
xlog_access = ctypes.c_uint32
xlog_fault = ctypes.c_uint32

# `xlog_runtime*` is an opaque token; it is never dereferenced on our side.
xlog_runtime_p = ctypes.c_void_p


class XlogBlock(ctypes.Structure):
    """`xlog_block`: a value handle, checked by generation on every use."""

    _fields_ = [
        ("ptr", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("stream", xlog_stream),
        ("device", ctypes.c_int32),
    ]


class XlogUse(ctypes.Structure):
    """`xlog_use`: one block of a recorded launch and how it is touched."""

    _fields_ = [
        ("block", XlogBlock),
        ("access", xlog_access),
    ]


class XlogConfig(ctypes.Structure):
    """`xlog_config`: runtime configuration; `struct_size` versions it."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("backend", xlog_backend),
        ("allocator", xlog_allocator),
        ("budget_bytes", ctypes.c_uint64),
        ("stream_pool_size", ctypes.c_uint32),
        ("log_path", ctypes.c_char_p),
        ("sim_capacity_bytes", ctypes.c_uint64),
        ("wait_on_pressure", ctypes.c_uint8),
        ("cache", ctypes.c_uint8),
        ("pool_release_threshold", ctypes.c_uint64),
        ("track_call_sites", ctypes.c_uint8),
        ("sim_devices", ctypes.c_uint32),
        ("memory", ctypes.c_uint8),
    ]


class XlogStats(ctypes.Structure):
    """`xlog_stats`: byte and block counters of a runtime.

    The caller sets `struct_size` (the library fills only the fields that
    fit in it): use `new()`, which does.
    """

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("live_bytes", ctypes.c_uint64),
        ("pending_bytes", ctypes.c_uint64),
        ("outstanding_bytes", ctypes.c_uint64),
        ("peak_outstanding_bytes", ctypes.c_uint64),
        ("budget_limit", ctypes.c_uint64),
        ("budget_remaining", ctypes.c_uint64),
        ("live_blocks", ctypes.c_uint64),
        ("pending_blocks", ctypes.c_uint64),
        ("allocations", ctypes.c_uint64),
        ("deallocations", ctypes.c_uint64),
        ("failed_allocations", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("cached_blocks", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64),
        ("cache_misses", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("log_lines_lost", ctypes.c_uint64),
        ("peak_live_bytes", ctypes.c_uint64),
        ("peak_live_blocks", ctypes.c_uint64),
        ("alloc_retries", ctypes.c_uint64),
        ("pages_mapped", ctypes.c_uint64),
        ("pages_unmapped", ctypes.c_uint64),
    ]

    @classmethod
    def new(cls) -> "XlogStats":
        """A zeroed structure with `struct_size` set, ready for xlog_get_stats."""
        return cls(struct_size=ctypes.sizeof(cls))


class XlogCloseReport(ctypes.Structure):
    """`xlog_close_report`: what the last close of a runtime found (the
    caller sets `struct_size`: use `new()`)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("leaked_blocks", ctypes.c_uint64),
        ("leaked_bytes", ctypes.c_uint64),
        ("unreleased_streams", ctypes.c_uint64),
    ]

    @classmethod
    def new(cls) -> "XlogCloseReport":
        """A zeroed structure with `struct_size` set."""
        return cls(struct_size=ctypes.sizeof(cls))


class XlogLiveBlock(ctypes.Structure):
    """`xlog_live_block`: one entry of `xlog_live_blocks` (the caller sets
    `struct_size` in the first element of the array)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("block", XlogBlock),
        ("device_bytes", ctypes.c_uint64),
        ("sequence", ctypes.c_uint64),
        ("allocations_since", ctypes.c_uint64),
        ("age_ns", ctypes.c_uint64),
        ("tag", ctypes.c_char_p),
        ("call_site", ctypes.c_char_p),
    ]


class XlogTagStat(ctypes.Structure):
    """`xlog_tag_stat`: one entry of `xlog_tag_stats`."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tag", ctypes.c_char_p),
        ("live_bytes", ctypes.c_uint64),
        ("live_blocks", ctypes.c_uint64),
        ("peak_bytes", ctypes.c_uint64),
        ("allocations", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
    ]


# `typedef void (*xlog_host_fn)(void *user);`
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_P = ctypes.POINTER

# name -> (restype, argtypes), in header order. The single source of truth
# for what `load()` declares on the library.
PROTOTYPES = {
    "xlog_version": (ctypes.c_char_p, []),
    "xlog_status_name": (ctypes.c_char_p, [xlog_status]),
    "xlog_last_error_message": (ctypes.c_size_t, [_P(ctypes.c_char), ctypes.c_size_t]),
    "xlog_config_init": (None, [_P(XlogConfig)]),
    "xlog_config_from_env": (xlog_status, [_P(XlogConfig)]),
    "xlog_runtime_open": (xlog_status, [ctypes.c_int32, _P(XlogConfig), _P(xlog_runtime_p)]),
    "xlog_runtime_close": (xlog_status, [xlog_runtime_p]),
    "xlog_runtime_close_report": (
        xlog_status,
        [xlog_runtime_p, _P(ctypes.c_uint64), _P(ctypes.c_uint64)],
    ),
    "xlog_runtime_close_detailed": (xlog_status, [xlog_runtime_p, _P(XlogCloseReport)]),
    "xlog_runtime_backend": (xlog_status, [xlog_runtime_p, _P(xlog_backend)]),
    "xlog_get_stats": (xlog_status, [xlog_runtime_p, _P(XlogStats)]),
    "xlog_stream_acquire": (xlog_status, [xlog_runtime_p, _P(xlog_stream)]),
    "xlog_stream_release": (xlog_status, [xlog_runtime_p, xlog_stream]),
    "xlog_stream_import": (xlog_status, [xlog_runtime_p, ctypes.c_void_p, _P(xlog_stream)]),
    "xlog_stream_native": (xlog_status, [xlog_runtime_p, xlog_stream, _P(ctypes.c_void_p)]),
    "xlog_stream_synchronize": (xlog_status, [xlog_runtime_p, xlog_stream]),
    "xlog_stream_enqueue_host": (
        xlog_status,
        [xlog_runtime_p, xlog_stream, HOST_FN, ctypes.c_void_p],
    ),
    "xlog_allocate": (
        xlog_status,
        [xlog_runtime_p, ctypes.c_uint64, xlog_stream, ctypes.c_char_p, _P(XlogBlock)],
    ),
    "xlog_deallocate": (xlog_status, [xlog_runtime_p, XlogBlock]),
    "xlog_block_validate": (xlog_status, [xlog_runtime_p, XlogBlock]),
    "xlog_prepare": (xlog_status, [xlog_runtime_p, XlogBlock, xlog_stream, xlog_access]),
    "xlog_finish": (xlog_status, [xlog_runtime_p, XlogBlock, xlog_stream, xlog_access]),
    "xlog_prepare_all": (xlog_status, [xlog_runtime_p, xlog_stream, _P(XlogUse), ctypes.c_size_t]),
    "xlog_finish_all": (xlog_status, [xlog_runtime_p, xlog_stream, _P(XlogUse), ctypes.c_size_t]),
    "xlog_enable_peer_access": (xlog_status, [xlog_runtime_p, xlog_runtime_p]),
    "xlog_reap": (xlog_status, [xlog_runtime_p, _P(ctypes.c_uint64)]),
    "xlog_trim": (xlog_status, [xlog_runtime_p, ctypes.c_uint64, _P(ctypes.c_uint64)]),
    "xlog_drain": (xlog_status, [xlog_runtime_p, _P(ctypes.c_uint64)]),
    # Stream capture (CUDA graphs).
    "xlog_capture_begin": (xlog_status, [xlog_runtime_p, xlog_stream, ctypes.c_uint32]),
    "xlog_capture_end": (
        xlog_status,
        [xlog_runtime_p, xlog_stream, _P(ctypes.c_void_p), _P(ctypes.c_uint64)],
    ),
    "xlog_capture_release": (xlog_status, [xlog_runtime_p, ctypes.c_uint64, _P(ctypes.c_uint64)]),
    # Inspection (src/ffi/inspect.rs).
    "xlog_live_blocks": (
        xlog_status,
        [xlog_runtime_p, _P(XlogLiveBlock), ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "xlog_tag_stats": (
        xlog_status,
        [xlog_runtime_p, _P(XlogTagStat), ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "xlog_reset_peak": (xlog_status, [xlog_runtime_p]),
    "xlog_memory_summary": (
        xlog_status,
        [xlog_runtime_p, _P(ctypes.c_char), ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "xlog_allocate_at": (
        xlog_status,
        [xlog_runtime_p, ctypes.c_uint64, xlog_stream, ctypes.c_char_p, ctypes.c_char_p, _P(XlogBlock)],
    ),
    "xlog_set_call_site": (xlog_status, [ctypes.c_char_p]),
    "xlog_sim_inject_fault": (xlog_status, [xlog_runtime_p, xlog_fault, ctypes.c_uint64]),
    "xlog_debug_panic": (xlog_status, []),
    "xlog_testing_interop_reset": (xlog_status, [ctypes.c_int32, _P(ctypes.c_uint64)]),
    "xlog_sim_deny_peer_access": (xlog_status, [xlog_runtime_p, xlog_runtime_p]),
    "xlog_sim_stream_begin_capture": (xlog_status, [xlog_runtime_p, ctypes.c_void_p, _P(ctypes.c_uint64)]),
    "xlog_sim_stream_end_capture": (xlog_status, [xlog_runtime_p, ctypes.c_void_p, _P(ctypes.c_uint64)]),
    "xlog_sim_touch": (xlog_status, [xlog_runtime_p, xlog_stream, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]),
    "xlog_sim_touch_faults": (xlog_status, [xlog_runtime_p, _P(ctypes.c_uint64)]),
    # Framework hooks (src/ffi/interop.rs).
    "xlog_interop_configure": (xlog_status, [ctypes.c_int32, _P(XlogConfig)]),
    "xlog_interop_runtime": (xlog_status, [ctypes.c_int32, _P(xlog_runtime_p)]),
    "xlog_interop_trim": (xlog_status, [ctypes.c_int32, ctypes.c_uint64, _P(ctypes.c_uint64)]),
    "xlog_interop_live_blocks": (ctypes.c_uint64, [ctypes.c_int32]),
    "xlog_torch_malloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p]),
    "xlog_torch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p]),
    "xlog_torch_free_any_device": (None, [ctypes.c_void_p]),
    "xlog_torch_record_stream": (xlog_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    "xlog_torch_record_stream_hook": (xlog_status, [ctypes.c_void_p, ctypes.c_void_p]),
    "xlog_torch_begin_allocate_to_pool": (
        xlog_status,
        [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p],
    ),
    "xlog_torch_end_allocate_to_pool": (xlog_status, [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64]),
    "xlog_torch_release_pool": (
        xlog_status,
        [ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, _P(ctypes.c_uint64)],
    ),
    "xlog_cupy_malloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32]),
    "xlog_cupy_free": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]),
}

# --------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------

ENV_VAR = "XLOG_CUDA_LIBRARY"
_SONAME = "libxlog_cuda.so.0"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# python/xlog_cuda/ -> the repository root, where the build trees live.
_REPO_ROOT = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", ".."))


def bundled_prefix() -> Optional[str]:
    """The install prefix inside this package when it came from a wheel
    (`pip install .`): xlog_cuda/lib/libxlog_cuda.so*, xlog_cuda/include,
    xlog_cuda/lib/cmake/XlogCuda, xlog_cuda/lib/pkgconfig. None in a source
    checkout, where the package holds only Python files."""
    if os.path.isfile(os.path.join(_PACKAGE_DIR, "lib", _SONAME)):
        return _PACKAGE_DIR
    return None


def _bundled_candidate() -> str:
    # The SONAME file: what a C++ program built against the bundled CMake
    # package loads too (its DT_NEEDED), so the two share one copy, and with
    # it one set of hook runtimes, in a process that uses both.
    return os.path.join(_PACKAGE_DIR, "lib", _SONAME)


class LibraryNotFoundError(ImportError):
    """libxlog_cuda.so could not be found or loaded.

    `tried` lists every place that was looked at, with the reason each one
    was not used.
    """

    def __init__(self, tried: List[Tuple[str, str]]):
        self.tried = list(tried)
        lines = "\n".join(f"  - {where}: {why}" for where, why in self.tried)
        super().__init__(
            "libxlog_cuda.so was not found. Set XLOG_CUDA_LIBRARY to its full path, "
            "or build it with `cargo build --release`. Places tried:\n" + lines
        )


def _build_tree_candidates() -> List[str]:
    """Build outputs next to this package, in the documented order."""
    out: List[str] = []
    cmake_dir = os.path.join(_REPO_ROOT, "build")
    exact = os.path.join(cmake_dir, "libxlog_cuda.so")
    versioned = sorted(p for p in glob.glob(os.path.join(cmake_dir, "libxlog_cuda.so*")) if p != exact)
    out.append(exact)
    out.extend(versioned)
    # Where the CMake build stages it (scripts/demo, scripts/test).
    out.append(os.path.join(cmake_dir, "lib", "libxlog_cuda.so"))
    out.append(os.path.join(_REPO_ROOT, "target", "release", "libxlog_cuda.so"))
    out.append(os.path.join(_REPO_ROOT, "target", "debug", "libxlog_cuda.so"))
    return out


def _loaded_file(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the dynamic loader really mapped for `lib` (via dladdr)."""

    class _DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return fallback
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    address = ctypes.cast(lib.xlog_version, ctypes.c_void_p).value
    if dladdr(address, ctypes.byref(info)) and info.dli_fname:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return fallback


def _declare(lib: ctypes.CDLL) -> None:
    missing = [name for name in PROTOTYPES if not hasattr(lib, name)]
    if missing:
        raise AttributeError("library lacks " + ", ".join(missing))
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _try_load(path: str) -> ctypes.CDLL:
    # CDLL (not PyDLL) releases the GIL around every call, which stream
    # workers need: a host callback takes the GIL on the worker thread while
    # the main thread may be blocked in xlog_stream_synchronize.
    lib = ctypes.CDLL(path)
    _declare(lib)
    return lib


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Load (once) and return the library.

    Order: `path` if given; else $XLOG_CUDA_LIBRARY (used alone: a set but
    wrong variable is an error, never silently replaced by another copy);
    else the copy bundled in this package (installed from a wheel:
    xlog_cuda/lib/libxlog_cuda.so.0); else the build trees of this checkout
    (build/libxlog_cuda.so*, build/lib, target/release, target/debug); else
    the system loader.
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried: List[Tuple[str, str]] = []

        def attempt(candidate: str) -> Optional[ctypes.CDLL]:
            try:
                return _try_load(candidate)
            except (OSError, AttributeError) as e:
                tried.append((candidate, str(e)))
                return None

        explicit = path if path is not None else os.environ.get(ENV_VAR) or None
        if explicit is not None:
            where = explicit if path is not None else f"${ENV_VAR}={explicit}"
            if not os.path.isfile(explicit):
                raise LibraryNotFoundError([(where, "no such file")])
            lib = attempt(explicit)
            if lib is None:
                raise LibraryNotFoundError([(where, tried[-1][1])])
            _lib, _lib_path = lib, _loaded_file(lib, os.path.realpath(explicit))
            return _lib

        tried.append((f"${ENV_VAR}", "not set"))
        for candidate in [_bundled_candidate()] + _build_tree_candidates():
            if not os.path.isfile(candidate):
                tried.append((candidate, "no such file"))
                continue
            lib = attempt(candidate)
            if lib is not None:
                _lib, _lib_path = lib, _loaded_file(lib, os.path.realpath(candidate))
                return _lib

        system_names = []
        found = ctypes.util.find_library("xlog_cuda")
        if found:
            system_names.append(found)
        if _SONAME not in system_names:
            system_names.append(_SONAME)
        for name in system_names:
            lib = attempt(name)
            if lib is not None:
                _lib, _lib_path = lib, _loaded_file(lib, name)
                return _lib
        if not found:
            tried.append(("ctypes.util.find_library('xlog_cuda')", "nothing found"))
        raise LibraryNotFoundError(tried)


def library_path() -> str:
    """Absolute path of the loaded libxlog_cuda (loading it if needed)."""
    load()
    assert _lib_path is not None
    return _lib_path

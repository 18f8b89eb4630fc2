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
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Set, Union

from . import _library, interop
from ._config import Backend, SizeLike
from ._errors import InvalidArgumentError
from ._runtime import LiveBlock, Stats, TagStats

__all__ = [
    "enable",
    "is_enabled",
    "enable_info",
    "stats",
    "trim",
    "record_stream",
    "oom_shim",
    "shim_cache_dir",
    "memory_stats",
    "memory_stats_of",
    "memory_summary",
    "reset_peak_memory_stats",
    "live_blocks",
    "tag_stats",
]

_WHO = "xlog_cuda.torch.enable"


@dataclasses.dataclass
class _Enabled:
    # The Python CUDAPluggableAllocator, kept alive with the process; None
    # when the shim installed its native allocator (PyTorch keeps that one).
    allocator: Any
    library: str
    devices: Set[int]
    # The OOM shim's path, or None with the reason it is not in use.
    shim: Optional[str]
    shim_problem: str
    # "cached" (loaded from the shim cache) or "built" (this process built it).
    shim_origin: str = ""
    # Whether Tensor.record_stream reaches xlog (the shim set PyTorch's
    # record-stream hook), and why not when it does not.
    record_stream_hook: bool = False
    record_stream_problem: str = ""
    # Whether torch.cuda.graph captures reach xlog (the shim set PyTorch's
    # graph-pool hooks), and why not when they do not.
    graph_pools_hook: bool = False
    graph_pools_problem: str = ""
    # "native" (the shim's XlogTorchAllocator: PyTorch calls xlog with no
    # bookkeeping between) or "pluggable" (PyTorch's CUDAPluggableAllocator
    # over the hooks), and why not native when it is pluggable.
    allocator_kind: str = "pluggable"
    allocator_problem: str = ""
    # Seconds spent in enable()'s steps: hooks, shim, allocator, total.
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)


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

    With the OOM shim built against PyTorch's CUDA headers, Tensor.record_stream
    and torch.cuda.graph captures reach xlog (enable_info() says whether
    they do, and why not); torch.compile(mode="reduce-overhead") does not
    work with a pluggable allocator (docs/frameworks.md, "CUDA graphs").

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
        # Checked before anything is set up.
        wanted = _wanted_allocator()
        started = time.perf_counter()
        interop.setup_hooks(
            device, budget, log_path, backend, wait_on_pressure,
            cache=cache, pool_release_threshold=pool_release_threshold, by=_WHO,
        )
        path = _library.library_path()
        hooks_done = time.perf_counter()
        shim, problem, origin = _oom_shim(torch)
        shim_done = time.perf_counter()
        kind, kind_problem = "pluggable", "XLOG_TORCH_ALLOCATOR=pluggable"
        if wanted == "native":
            kind_problem = _install_native(shim, problem)
            if not kind_problem:
                kind = "native"
        if kind == "native":
            allocator = None
        elif shim is not None:
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
            if allocator is not None:
                torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            raise RuntimeError(
                f"{_WHO}: PyTorch refused to switch to the xlog allocator ({e}). Some other "
                "allocator is in place already (another pluggable allocator, or PyTorch's own after "
                "CUDA memory was used); call enable() before anything else touches CUDA."
            ) from e
        hooked, hook_problem = _install_record_stream(shim, problem)
        pools, pools_problem = _install_graph_pools(shim, problem)
        if not pools:
            warnings.warn(
                f"{_WHO}: torch.cuda.graph capture does not reach xlog ({pools_problem}): a capture "
                "under enable() fails (CUDA_ERROR_STREAM_CAPTURE_ISOLATION). Capture graphs with "
                "PyTorch's own allocator, or see docs/frameworks.md, \"CUDA graphs\".",
                RuntimeWarning,
                stacklevel=2,
            )
        if not hooked:
            warnings.warn(
                f"{_WHO}: Tensor.record_stream does not reach xlog ({hook_problem}): PyTorch drops it, "
                "so memory used on another stream may be reused while that stream still reads it. "
                "Call xlog_cuda.torch.record_stream(tensor, stream) instead, or synchronize the other "
                "stream before the tensor is freed.",
                RuntimeWarning,
                stacklevel=2,
            )
        done = time.perf_counter()
        seconds = {
            "hooks": hooks_done - started,
            "shim": shim_done - hooks_done,
            "allocator": done - shim_done,
            "total": done - started,
        }
        _state = _Enabled(
            allocator=allocator, library=path, devices={device}, shim=shim, shim_problem=problem,
            shim_origin=origin, seconds=seconds, record_stream_hook=hooked, record_stream_problem=hook_problem,
            graph_pools_hook=pools, graph_pools_problem=pools_problem,
            allocator_kind=kind, allocator_problem="" if kind == "native" else kind_problem,
        )


_SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_oom_shim.cpp")
_SHIM_NAME = "xlog_torch_oom_shim"


def shim_cache_dir() -> str:
    """Where built OOM shims are kept: $XLOG_CUDA_CACHE_DIR, else
    $XDG_CACHE_HOME/xlog_cuda, else ~/.cache/xlog_cuda."""
    explicit = os.environ.get("XLOG_CUDA_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlog_cuda")


def shim_key(torch_version: str, source: bytes, abi: str = "") -> str:
    """The cache entry of a shim: PyTorch's version, the build ABI (C++ ABI,
    machine, Python) and a hash of the shim's source. A directory name."""
    digest = hashlib.sha256()
    for part in (torch_version.encode(), abi.encode(), source):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    tag = "".join(c if c.isalnum() else "_" for c in torch_version)
    return f"torch_oom_shim_{tag}_{digest.hexdigest()[:16]}"


def shim_path(key: str, cache_dir: Optional[str] = None) -> str:
    """The built shim of cache entry `key`."""
    return os.path.join(cache_dir if cache_dir is not None else shim_cache_dir(), key, _SHIM_NAME + ".so")


def _torch_abi(torch) -> str:
    cxx11 = getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", "?")
    return f"cxx11abi={cxx11};{platform.machine()};{sys.implementation.cache_tag}"


def _shim_key_of(torch) -> str:
    with open(_SHIM_SOURCE, "rb") as f:
        source = f.read()
    return shim_key(str(torch.__version__), source, _torch_abi(torch))


# Next to a shim built without the record-stream hook: why the build with
# it failed (so later processes neither retry it nor lose the reason).
_NO_RECORD_STREAM = "no-record-stream.txt"


def _compile(cpp_extension, work: str, record_stream: bool) -> str:
    """One cpp_extension build of the shim into `work`; its .so path.
    `record_stream` adds PyTorch's CUDA headers and libraries (the
    record-stream hook needs torch/csrc/cuda/CUDAPluggableAllocator.h)."""
    extra = {"extra_cflags": ["-DXLOG_SHIM_RECORD_STREAM=1"], "with_cuda": True} if record_stream else {}
    os.makedirs(work, exist_ok=True)
    built = cpp_extension.load(
        name=_SHIM_NAME, sources=[_SHIM_SOURCE], build_directory=work, is_python_module=False, verbose=False,
        **extra,
    )
    # cpp_extension returns the library's path; a second build in one
    # process may have named it <name>_v1.so.
    if not (isinstance(built, str) and os.path.isfile(built)):
        found = [os.path.join(work, n) for n in os.listdir(work) if n.endswith(".so")]
        if len(found) != 1:
            raise RuntimeError(f"cpp_extension.load left {len(found)} .so files in {work}")
        built = found[0]
    return built


def _last_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"


def _build_shim(final: str) -> None:
    """Compile the shim with torch.utils.cpp_extension into a scratch
    directory next to `final`, then move it into place atomically, so a
    concurrent process sees either no shim or a whole one. One build at a
    time per entry (a lock file); a process that waited on it finds the shim
    built and returns.

    The full shim (OOM error and record-stream hook) needs PyTorch's CUDA
    headers; where that build fails, the shim is built without the hook,
    and the reason is kept next to it (`no-record-stream.txt`)."""
    import fcntl

    entry = os.path.dirname(final)
    os.makedirs(entry, exist_ok=True)
    with open(os.path.join(entry, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(final):
            return
        from torch.utils import cpp_extension

        work = tempfile.mkdtemp(prefix="build-", dir=entry)
        try:
            try:
                built = _compile(cpp_extension, os.path.join(work, "full"), record_stream=True)
                no_hook = None
            except Exception as e:  # noqa: BLE001 - the reason is kept, the OOM-only build follows
                no_hook = f"building it with PyTorch's CUDA headers failed: {_last_line(e)}"
                built = _compile(cpp_extension, os.path.join(work, "oom"), record_stream=False)
            marker = os.path.join(entry, _NO_RECORD_STREAM)
            if no_hook is None:
                if os.path.exists(marker):
                    os.remove(marker)
            else:
                with open(marker + ".tmp", "w") as f:
                    f.write(no_hook + "\n")
                os.replace(marker + ".tmp", marker)
            os.replace(built, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)


# The shim loaded in this process (ctypes handle), once bound.
_shim_handle: Optional[ctypes.CDLL] = None


def _bind_shim(path: str) -> None:
    global _shim_handle
    lib = _library.load()
    handle = ctypes.CDLL(path)
    handle.xlog_shim_bind.argtypes = [ctypes.c_void_p] * 4
    handle.xlog_shim_bind.restype = None
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    handle.xlog_shim_bind(
        addr(lib.xlog_torch_malloc), addr(lib.xlog_torch_free), addr(lib.xlog_last_error_message),
        addr(lib.xlog_torch_record_stream_hook),
    )
    handle.xlog_shim_install_record_stream.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    handle.xlog_shim_install_record_stream.restype = ctypes.c_int
    handle.xlog_shim_has_record_stream.argtypes = []
    handle.xlog_shim_has_record_stream.restype = ctypes.c_int
    if hasattr(handle, "xlog_shim_bind_graph_pools"):
        handle.xlog_shim_bind_graph_pools.argtypes = [ctypes.c_void_p] * 3
        handle.xlog_shim_bind_graph_pools.restype = None
        handle.xlog_shim_bind_graph_pools(
            addr(lib.xlog_torch_begin_allocate_to_pool), addr(lib.xlog_torch_end_allocate_to_pool),
            addr(lib.xlog_torch_release_pool),
        )
    _shim_handle = handle


_ALLOCATOR_KINDS = ("native", "pluggable")


def _wanted_allocator() -> str:
    """XLOG_TORCH_ALLOCATOR: "native" (the default) or "pluggable";
    InvalidArgumentError for anything else, before anything changes."""
    wanted = os.environ.get("XLOG_TORCH_ALLOCATOR", "native").strip().lower() or "native"
    if wanted not in _ALLOCATOR_KINDS:
        raise InvalidArgumentError(
            f"{_WHO}: XLOG_TORCH_ALLOCATOR={wanted!r} is not one of {', '.join(_ALLOCATOR_KINDS)}"
        )
    return wanted


def _install_native(shim: Optional[str], shim_problem: str) -> str:
    """Make PyTorch's current allocator the shim's native one, which calls
    the library with no bookkeeping of its own (the shim's source, job 4):
    "" when installed, else why not (PyTorch's allocator then unchanged,
    and enable() installs the CUDAPluggableAllocator instead)."""
    if shim is None or _shim_handle is None:
        return f"no shim: {shim_problem}"
    handle = _shim_handle
    if not hasattr(handle, "xlog_shim_install_native"):
        return "the shim has no native allocator (built from an older source)"
    lib = _library.load()
    handle.xlog_shim_install_native.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    handle.xlog_shim_install_native.restype = ctypes.c_int
    why = ctypes.create_string_buffer(512)
    free_any = ctypes.cast(lib.xlog_torch_free_any_device, ctypes.c_void_p).value
    if handle.xlog_shim_install_native(free_any, why, len(why)) != 1:
        return why.value.decode(errors="replace") or "the shim could not install it"
    return ""


def _install_graph_pools(shim: Optional[str], shim_problem: str) -> "tuple[bool, str]":
    """Set PyTorch's graph-pool hooks (beginAllocateToPool,
    endAllocateToPool, releasePool) through the shim, after the allocator
    swap, so that torch.cuda.graph captures reach xlog: (True, "") or
    (False, why not)."""
    if shim is None or _shim_handle is None:
        return False, f"no shim: {shim_problem}"
    handle = _shim_handle
    if not all(hasattr(handle, n) for n in ("xlog_shim_install_graph_pools", "xlog_shim_has_graph_pools")):
        return False, "the shim has no graph-pool hooks (built from an older source)"
    handle.xlog_shim_has_graph_pools.argtypes = []
    handle.xlog_shim_has_graph_pools.restype = ctypes.c_int
    if not handle.xlog_shim_has_graph_pools():
        return False, _why_no_cuda_headers(shim)
    handle.xlog_shim_install_graph_pools.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    handle.xlog_shim_install_graph_pools.restype = ctypes.c_int
    why = ctypes.create_string_buffer(512)
    if handle.xlog_shim_install_graph_pools(why, len(why)) != 1:
        return False, why.value.decode(errors="replace") or "the shim could not set the hooks"
    return True, ""


def _why_no_cuda_headers(shim: str) -> str:
    """Why the shim next to `shim` was built without PyTorch's CUDA headers
    (the note its build left), for the hooks that need them."""
    try:
        with open(os.path.join(os.path.dirname(shim), _NO_RECORD_STREAM)) as f:
            why = f.read().strip()
    except OSError:
        why = ""
    return why or "the shim was built without PyTorch's CUDA headers"


def _install_record_stream(shim: Optional[str], shim_problem: str) -> "tuple[bool, str]":
    """Set PyTorch's record-stream hook through the shim (after the
    allocator swap): (True, "") or (False, why not)."""
    if shim is None or _shim_handle is None:
        return False, f"no shim: {shim_problem}"
    if not _shim_handle.xlog_shim_has_record_stream():
        return False, _why_no_cuda_headers(shim)
    why = ctypes.create_string_buffer(512)
    if _shim_handle.xlog_shim_install_record_stream(why, len(why)) != 1:
        return False, why.value.decode(errors="replace") or "the shim could not set the hook"
    return True, ""


def _oom_shim(torch) -> "tuple[Optional[str], str, str]":
    """The shim that turns a refused allocation into torch.OutOfMemoryError,
    loaded and bound: (path, "", "cached" or "built"), or (None, why not, "").

    It is built once per machine and cache entry (`shim_key`: PyTorch
    version, ABI, shim source) with torch.utils.cpp_extension, which costs
    seconds; later processes load the built file directly, without
    importing cpp_extension or running ninja. XLOG_TORCH_OOM_SHIM=0 turns
    the shim off."""
    if os.environ.get("XLOG_TORCH_OOM_SHIM", "1") == "0":
        return None, "XLOG_TORCH_OOM_SHIM=0", ""
    try:
        final = shim_path(_shim_key_of(torch))
        origin = "cached"
        if not os.path.isfile(final):
            _build_shim(final)
            origin = "built"
        try:
            _bind_shim(final)
        except OSError:
            if origin == "built":
                raise
            # A cached file that does not load (truncated, or built against
            # something since replaced): build it again, once.
            os.remove(final)
            _build_shim(final)
            origin = "built"
            _bind_shim(final)
        return final, "", origin
    except Exception as e:  # noqa: BLE001 - any build problem falls back, with the reason
        return None, f"building it failed: {_last_line(e)}", ""


def oom_shim() -> str:
    """How refused allocations reach PyTorch: "torch.OutOfMemoryError (shim
    PATH)", whose message carries the numbers (requested, live, cached,
    pending, limit), or why the shim is not in use (then PyTorch gets an
    unchecked NULL). Empty before `enable()`."""
    if _state is None:
        return ""
    if _state.shim is not None:
        return f"torch.OutOfMemoryError (shim {_state.shim})"
    return f"no shim: {_state.shim_problem}"


def enable_info() -> Dict[str, Any]:
    """What `enable()` did in this process: the library, the OOM shim (its
    path, or why it is not in use) and whether it came from the shim cache
    ("cached") or was built here ("built"), whether `Tensor.record_stream`
    reaches xlog ("record_stream_hook", else "record_stream_problem" says
    why not), whether `torch.cuda.graph` captures reach xlog
    ("graph_pools_hook", else "graph_pools_problem" says why not), which
    allocator PyTorch calls ("allocator": "native", the shim's allocator
    that calls xlog directly, or "pluggable", PyTorch's
    CUDAPluggableAllocator over the hooks; "allocator_problem" says why not
    native), and the seconds its steps took
    ("hooks": opening the hook runtime; "shim"; "allocator": installing it;
    "total"). Empty before `enable()`."""
    if _state is None:
        return {}
    return {
        "library": _state.library,
        "shim": _state.shim,
        "shim_problem": _state.shim_problem,
        "shim_origin": _state.shim_origin,
        "record_stream_hook": _state.record_stream_hook,
        "record_stream_problem": _state.record_stream_problem,
        "graph_pools_hook": _state.graph_pools_hook,
        "graph_pools_problem": _state.graph_pools_problem,
        "allocator": _state.allocator_kind,
        "allocator_problem": _state.allocator_problem,
        "seconds": dict(_state.seconds),
        "devices": sorted(_state.devices),
    }


def is_enabled() -> bool:
    """Whether `enable()` has installed the allocator in this process."""
    return _state is not None


def stats(device: int = 0) -> Stats:
    """Stats of `device`'s hook runtime. It is shared: CuPy (through
    `xlog_cuda.cupy`) and any other user of the hooks of this device are
    counted in it too. Opens the hook runtime if nothing has yet."""
    return interop.stats(device)


def memory_stats_of(st: Stats, requested_bytes: Optional[int] = None) -> Dict[str, int]:
    """`st` under the key names of `torch.cuda.memory_stats()`, for the
    keys that have a meaning here (pool "all" only: xlog has no large/small
    pools). Bytes are device bytes (sizes rounded up as xlog hands them out).

    - allocation / active .{current,peak,allocated,freed}: live blocks, their
      peak, allocations and frees (a block is active exactly while it is
      allocated: a freed block's pending stream uses are waits queued on
      the GPU, not held memory).
    - allocated_bytes / active_bytes .{current,peak}: live bytes and their
      peak.
    - reserved_bytes.all.{current,peak}: what xlog holds from the driver
      (live + cached + pending) and its peak; the driver pool's own figure is
      `stats().reserved_bytes`.
    - segment.all.current: blocks xlog holds from the driver (live, cached,
      pending), each one driver allocation.
    - inactive_split / inactive_split_bytes .all.current: 0, as xlog never
      splits a block.
    - requested_bytes.all.current: the requested (unrounded) sizes of the
      live blocks, when `requested_bytes` is given.
    - num_alloc_retries: refusals answered by releasing the cache and trying
      again; num_ooms: refused allocations; num_device_alloc: allocations
      that went to the driver (cache misses).
    """
    out: Dict[str, int] = {}
    for kind in ("allocation", "active"):
        out[f"{kind}.all.current"] = st.live_blocks
        out[f"{kind}.all.peak"] = max(st.peak_live_blocks, st.live_blocks)
        out[f"{kind}.all.allocated"] = st.allocations
        out[f"{kind}.all.freed"] = st.deallocations
    for kind in ("allocated_bytes", "active_bytes"):
        out[f"{kind}.all.current"] = st.live_bytes
        out[f"{kind}.all.peak"] = max(st.peak_live_bytes, st.live_bytes)
    out["reserved_bytes.all.current"] = st.outstanding_bytes
    out["reserved_bytes.all.peak"] = max(st.peak_outstanding_bytes, st.outstanding_bytes)
    out["segment.all.current"] = st.live_blocks + st.cached_blocks + st.pending_blocks
    out["inactive_split.all.current"] = 0
    out["inactive_split_bytes.all.current"] = 0
    if requested_bytes is not None:
        out["requested_bytes.all.current"] = requested_bytes
    out["num_alloc_retries"] = st.alloc_retries
    out["num_ooms"] = st.failed_allocations
    out["num_device_alloc"] = st.cache_misses
    return dict(sorted(out.items()))


def memory_stats(device: int = 0) -> Dict[str, int]:
    """`torch.cuda.memory_stats()` for memory PyTorch allocates through
    xlog (`device`'s hook runtime, shared with CuPy and other hook users):
    PyTorch's own function reports nothing for a pluggable allocator. See
    `memory_stats_of` for the keys. PyTorch is not needed."""
    with interop.runtime(device) as rt:
        st = rt.stats()
        requested = sum(b.size for b in rt.live_blocks())
    return memory_stats_of(st, requested)


def memory_summary(device: int = 0) -> str:
    """`torch.cuda.memory_summary()` for xlog: totals (live, cached,
    pending, held, reserved, peaks, budget), the per-tag table and the
    largest live blocks of `device`'s hook runtime."""
    return interop.memory_summary(device)


def reset_peak_memory_stats(device: int = 0) -> None:
    """`torch.cuda.reset_peak_memory_stats()` for xlog: every peak of
    `device`'s hook runtime restarts from its current value."""
    interop.reset_peak(device)


def live_blocks(device: int = 0) -> List[LiveBlock]:
    """The blocks live in `device`'s hook runtime, oldest first: the
    memory-snapshot counterpart. With XLOG_TRACK_CALLSITES=1 each carries its
    age in seconds and the label `xlog_cuda.call_site(...)` set around the
    code that allocated it."""
    return interop.live_block_list(device)


def tag_stats(device: int = 0) -> List[TagStats]:
    """Counters per tag of `device`'s hook runtime."""
    return interop.tag_stats(device)


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

    What `Tensor.record_stream` does once `enable()` has installed the
    shim's record-stream hook (`enable_info()["record_stream_hook"]`); this
    function works without the hook too (no shim, `XLOG_TORCH_OOM_SHIM=0`,
    a shim built without PyTorch's CUDA headers), where PyTorch drops
    `Tensor.record_stream`. When the tensor's memory is freed, its
    allocation stream first waits for the work queued on `stream` up to
    that moment.
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

"""Runtime, Stream and Block: owning Python objects over the C handles."""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import enum
import itertools
import sys
import threading
import time
import warnings
from typing import Any, Callable, Deque, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _errors, _library
from ._config import U32_MAX, U64_MAX, Config
from ._errors import InvalidArgumentError, call

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


class Access(enum.IntEnum):
    """How a launch touches a block (`xlog_access`)."""

    READ = 1
    WRITE = 2
    READ_WRITE = 3


class Fault(enum.IntEnum):
    """Sim fault kinds for `Runtime.sim_inject_fault` (`xlog_fault`)."""

    ALLOC = 1
    FREE = 2
    EVENT_RECORD = 3
    STREAM_CREATE = 4


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of `xlog_stats`.

    `outstanding_bytes = live_bytes + cached_bytes + pending_bytes`: what
    the runtime holds from the driver, and what the budget charges. Cached
    bytes are freed blocks kept in per-stream caches for reuse (`trim`
    hands them back); pending bytes were handed back to the driver, the GPU
    not yet seen past the free. `reserved_bytes` is the driver pool's own
    reserved-memory counter on CUDA (outstanding bytes on sim).
    """

    live_bytes: int
    pending_bytes: int
    outstanding_bytes: int
    peak_outstanding_bytes: int
    budget_limit: int
    budget_remaining: int
    live_blocks: int
    pending_blocks: int
    allocations: int
    deallocations: int
    failed_allocations: int
    cached_bytes: int
    cached_blocks: int
    cache_hits: int
    cache_misses: int
    reserved_bytes: int
    log_lines_lost: int
    #: Highest live_bytes / live_blocks since the runtime opened or the last
    #: `reset_peak()`.
    peak_live_bytes: int = 0
    peak_live_blocks: int = 0
    #: Refused allocations tried again after relieving pressure.
    alloc_retries: int = 0
    #: Physical pages the arena mapped / unmapped since the runtime opened
    #: (0 with memory="pool"); in a repeating loop they should stop growing.
    pages_mapped: int = 0
    pages_unmapped: int = 0


@dataclasses.dataclass(frozen=True)
class LiveBlock:
    """One live block (`xlog_live_block`).

    `size` is the requested size, `device_bytes` what the block takes on the
    device. `sequence` numbers the allocations on the block's stream (1 = the
    first; the streams of one internal table shard, ids 32 apart, share the
    count) and `allocations_since` counts those made there after this one:
    the block's age in allocations. With call-site tracking (`Config(track_call_sites=True)` or
    XLOG_TRACK_CALLSITES=1) `age_s` is the time since allocation and
    `call_site` where it happened (for Python callers a traceback summary,
    innermost frame first); otherwise both are None.
    """

    ptr: int
    size: int
    device_bytes: int
    generation: int
    stream: int
    device: int
    tag: str
    sequence: int
    allocations_since: int
    age_s: Optional[float]
    call_site: Optional[str]


@dataclasses.dataclass(frozen=True)
class TagStats:
    """Counters of one tag (`xlog_tag_stat`); bytes are device bytes.
    Tags past the process's tag-table bound share the "(other)" entry."""

    tag: str
    live_bytes: int
    live_blocks: int
    peak_bytes: int
    allocations: int
    frees: int


# Frames of a Python call site kept in the summary.
CALL_SITE_FRAMES = 4


def call_site_summary(skip: int = 1, frames: int = CALL_SITE_FRAMES) -> str:
    """The caller's traceback as one short line, innermost frame first:
    "train.py:41 in step <- train.py:80 in main". Frames of this package are
    left out, so the line starts at the user's code. `skip` drops that many
    innermost frames first (1: this function's caller's own frame stays)."""
    parts: List[str] = []
    frame = sys._getframe(skip)
    package = __name__.rsplit(".", 1)[0] + "."
    while frame is not None and len(parts) < frames:
        module = frame.f_globals.get("__name__", "")
        if not (module == package[:-1] or module.startswith(package)):
            code = frame.f_code
            parts.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    return " <- ".join(parts)


_call_site_labels = threading.local()


class call_site:
    """Label this thread's allocations with `text` while the `with` block
    runs (`xlog_set_call_site`), on every runtime that tracks call sites,
    the framework hooks' included: how tensors PyTorch allocates through
    xlog get a call site. Labels nest; an explicit `call_site=` of
    `Runtime.allocate` (or its traceback summary) wins over the label.

        with xlog_cuda.call_site("encoder forward"):
            y = model.encoder(x)
    """

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise InvalidArgumentError(f"call_site text must be a str, got {type(text).__name__}")
        _utf8("call_site text", text)  # refused here, not at __enter__
        self.text = text

    def __enter__(self) -> "call_site":
        stack = getattr(_call_site_labels, "stack", None)
        if stack is None:
            stack = _call_site_labels.stack = []
        stack.append(self.text)
        call(_lib().xlog_set_call_site, self.text.encode("utf-8").replace(b"\0", b"?"))
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _call_site_labels.stack
        stack.pop()
        previous = stack[-1].encode("utf-8").replace(b"\0", b"?") if stack else None
        call(_lib().xlog_set_call_site, previous)


def _utf8(what: str, text: str) -> bytes:
    """`text` as UTF-8; InvalidArgumentError (as for any bad argument) when
    it cannot be (a lone surrogate, which str allows and UTF-8 does not)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(
            f"{what} {text!r} is not valid text: {e.reason} at index {e.start} (a lone surrogate cannot be UTF-8)"
        ) from None


def _text(raw: Optional[bytes]) -> Optional[str]:
    return None if raw is None else raw.decode("utf-8", "replace")


def _fill_array(fn: Any, handle: int, struct: Any) -> List[Any]:
    """Call a fill-a-buffer entry point until the buffer holds every entry
    (other threads may allocate between the sizing call and the filling one)."""
    count = ctypes.c_size_t()
    call(fn, handle, None, 0, ctypes.byref(count))
    while True:
        cap = count.value + 16
        buf = (struct * cap)()
        buf[0].struct_size = ctypes.sizeof(struct)
        call(fn, handle, buf, cap, ctypes.byref(count))
        if count.value <= cap:
            return list(buf[: count.value])


class LeakReport(NamedTuple):
    """What a close found still live (and freed on the caller's behalf):
    `blocks` and their `bytes`, and `streams`, the pooled streams acquired
    and never released (released on the caller's behalf; imported streams
    are the caller's own and not counted). Each is also named on stderr and
    in the log."""

    blocks: int
    bytes: int
    streams: int = 0


def _lib() -> ctypes.CDLL:
    """The library, for a call about to be made: first runs the frees and
    closes that finalizers had to defer (see `_finalize`)."""
    _run_deferred()
    return _library.load()


def _checked_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} = {value} is outside {low}..{high}")
    return value


def _stream_id(stream: Union["Stream", int]) -> int:
    if isinstance(stream, Stream):
        return stream.id
    return _checked_int("stream", stream, 0, U32_MAX)


def _access_value(access: Union[Access, int, str]) -> int:
    if isinstance(access, str):
        try:
            return int(Access[access.strip().upper()])
        except KeyError:
            raise InvalidArgumentError(f"access {access!r} is not one of 'read', 'write', 'read_write'") from None
    # Other numbers go to the library, whose check names the valid values.
    return _checked_int("access", access, 0, U32_MAX)


# ---------------------------------------------------------------------------
# Host callbacks
# ---------------------------------------------------------------------------
#
# One C trampoline serves every callback: the `user` pointer carries a key
# into `_pending_callbacks`, and the trampoline removes the entry when it
# runs. So the Python callable lives exactly until the stream has run it,
# and the CFUNCTYPE object itself (module level) can never be collected
# while the library still holds its address.

_pending_callbacks: Dict[int, Tuple[Callable[[], Any], List[BaseException]]] = {}
_callback_keys = itertools.count(1)
_callback_lock = threading.Lock()


# Depth of host callbacks this thread is running (they do not nest, but a
# counter costs nothing). No xlog call is allowed inside one: the library
# refuses them with STREAM_MISUSE on both backends.
_callback_state = threading.local()


def in_host_callback() -> bool:
    """Whether this thread is running a host callback enqueued from Python.

    No xlog call is allowed there (the library refuses each with
    StreamMisuseError: on CUDA a host function must not call the driver, and
    a wait from it for its own stream would never return). `Block.read` and
    `Block.write` still work there on sim: they only touch host memory.
    """
    return getattr(_callback_state, "depth", 0) > 0


# Callbacks running now (entries already taken off `_pending_callbacks`).
_running_callbacks = 0


def _run_host_callback(user: Optional[int]) -> None:
    global _running_callbacks
    with _callback_lock:
        entry = _pending_callbacks.pop(user or 0, None)
        if entry is not None:
            _running_callbacks += 1
    if entry is None:
        return
    fn, errors = entry
    _callback_state.depth = getattr(_callback_state, "depth", 0) + 1
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
        errors.append(e)
    finally:
        _callback_state.depth -= 1
        with _callback_lock:
            _running_callbacks -= 1


_HOST_TRAMPOLINE = _library.HOST_FN(_run_host_callback)

# How long the interpreter's exit waits for host callbacks still queued.
EXIT_CALLBACK_WAIT_S = 10.0


def _drain_host_callbacks_at_exit() -> None:
    """At exit, before the interpreter finalizes: wait (the GIL released)
    until every host callback enqueued from Python has run, at most
    `EXIT_CALLBACK_WAIT_S`. A callback that started while the interpreter
    finalizes would take the GIL on a stream's thread, which Python then
    ends by unwinding it through the library's frames, and the process
    aborts ("FATAL: exception not rethrown"): so a script that exits with
    work still queued on a runtime it never closed would crash."""
    deadline = time.monotonic() + EXIT_CALLBACK_WAIT_S
    while time.monotonic() < deadline:
        with _callback_lock:
            if not _pending_callbacks and _running_callbacks == 0:
                return
        time.sleep(0.001)


atexit.register(_drain_host_callbacks_at_exit)


def pending_host_callbacks() -> int:
    """Callbacks enqueued from Python that have not run yet (for tests)."""
    with _callback_lock:
        return len(_pending_callbacks)


# ---------------------------------------------------------------------------
# Finalizers
# ---------------------------------------------------------------------------
#
# A Block collected without free() is freed, and a Runtime collected without
# close() is closed, as Python files are. The garbage collector runs
# finalizers wherever an object happens to be collected, which may be where
# no library call is allowed: inside a host callback (refused), or on a
# thread between a library call and the read of its error message (the
# finalizer's call would replace the message). There the work is deferred,
# and runs before the next library call made through this package from an
# ordinary thread (see `_lib`), or at exit.

_deferred: Deque[Callable[[], None]] = collections.deque()


def _finalize(action: Callable[[], None]) -> None:
    """Run a finalizer's library call now if that is safe, else later."""
    if sys.is_finalizing():
        return  # the process is going away, and the library with it
    if in_host_callback() or _errors.in_call():
        _deferred.append(action)
        return
    try:
        action()
    except Exception:  # noqa: BLE001 - a finalizer has no caller to tell
        pass


def _run_deferred() -> None:
    if not _deferred or in_host_callback() or _errors.in_call():
        return
    while True:
        try:
            action = _deferred.popleft()
        except IndexError:
            return
        try:
            action()
        except Exception:  # noqa: BLE001 - as in _finalize
            pass


atexit.register(_run_deferred)


def _free_collected(runtime: "Runtime", raw: _library.XlogBlock) -> None:
    """The stream-ordered free of a Block nobody holds any more. Harmless
    once the runtime is closed: the close freed the block already (and the
    library refuses the closed handle)."""

    def free() -> None:
        if not runtime.closed:
            _library.load().xlog_deallocate(runtime.handle, raw)

    _finalize(free)


def _note_exit_failure(exc: Optional[BaseException], error: BaseException, what: str) -> None:
    """Leaving a `with` block on an exception: keep that exception (the
    caller's) and attach `error`, from the exit's own cleanup, as a note."""
    if exc is None:
        raise error
    note = f"while leaving the with block, {what} also failed: {error!r}"
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(note)
    else:  # Python 3.10: no add_note, keep the text where 3.11 would
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------


class Runtime:
    """An open runtime of one device. Use it as a context manager.

    `config` defaults to `Config.from_env()` (library defaults plus the
    XLOG_* environment, as `xlog_runtime_open(dev, NULL, ...)` does);
    keyword overrides replace fields of it:
    `Runtime(backend="sim", budget_bytes="64MiB")`.
    """

    # A Runtime whose open failed has nothing to close (see __del__).
    _close_report: Optional[LeakReport] = LeakReport(0, 0)

    def __init__(self, device: int = 0, config: Optional[Config] = None, **overrides: Any):
        if config is None:
            config = Config.from_env()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.device = _checked_int("device", device, I32_MIN, I32_MAX)
        self.config = config
        self._track_call_sites = bool(config.track_call_sites)
        raw = config.to_c()
        handle = ctypes.c_void_p()
        lib = _lib()
        call(lib.xlog_runtime_open, self.device, ctypes.byref(raw), ctypes.byref(handle))
        self._adopt_handle(handle.value or 0)

    def _adopt_handle(self, handle: int) -> None:
        """Own an open `xlog_runtime*` token (closing it if it is unusable)."""
        lib = _lib()
        self._handle: int = handle
        self._close_report: Optional[LeakReport] = None
        code = _library.xlog_backend()
        try:
            call(lib.xlog_runtime_backend, self._handle, ctypes.byref(code))
        except BaseException:
            lib.xlog_runtime_close(self._handle)
            self._close_report = LeakReport(0, 0)
            raise
        self._backend = {1: "cuda", 2: "sim"}.get(code.value, str(code.value))

    @classmethod
    def _from_handle(cls, handle: int, device: int, config: Optional[Config] = None) -> "Runtime":
        """A Runtime owning a handle opened elsewhere (e.g. xlog_interop_runtime)."""
        self = cls.__new__(cls)
        self.device = device
        self.config = config
        if config is None:
            try:
                config = Config.from_env()
            except _errors.XlogError:
                config = Config()
        self._track_call_sites = bool(config.track_call_sites)
        self._adopt_handle(handle)
        return self

    # -- lifetime --

    @property
    def handle(self) -> int:
        """The `xlog_runtime*` token (still the old value after close)."""
        return self._handle

    @property
    def closed(self) -> bool:
        return self._close_report is not None

    @property
    def backend(self) -> str:
        """'sim' or 'cuda': the backend the runtime really runs on."""
        return self._backend

    def close(self) -> LeakReport:
        """Close the runtime; returns the blocks and bytes still live and
        the streams never released.

        The library waits for the work queued on the runtime's streams (host
        callbacks included), frees leaked blocks, waits for pending frees and
        stops the streams. Closing again returns the first report without a
        C call. From inside a host callback, and while a stream of the
        runtime takes part in a capture, the close is refused
        (StreamMisuseError) and the runtime stays open.
        """
        if self._close_report is not None:
            return self._close_report
        found = _library.XlogCloseReport.new()
        status, message = _errors.call_status(_lib().xlog_runtime_close_detailed, self._handle, ctypes.byref(found))
        if status == _errors.Status.STREAM_MISUSE:
            raise _errors.error_for(status, message)  # refused: nothing changed
        # The handle is invalid afterwards even if an error is returned.
        self._close_report = LeakReport(found.leaked_blocks, found.leaked_bytes, found.unreleased_streams)
        if status != _errors.Status.OK:
            raise _errors.error_for(status, message)
        return self._close_report

    def __del__(self) -> None:
        # A Runtime nobody closed is closed when collected, with a
        # ResourceWarning, as an unclosed file is.
        if self._close_report is not None:
            return
        try:
            warnings.warn(f"unclosed {self!r}; closing it (use `with` or close())", ResourceWarning, source=self)
        except Exception:  # noqa: BLE001 - e.g. at interpreter shutdown
            pass
        handle = self._handle

        def close() -> None:
            _library.load().xlog_runtime_close(handle)

        self._close_report = LeakReport(0, 0)
        _finalize(close)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        try:
            self.close()
        except _errors.XlogError as e:
            _note_exit_failure(exc, e, f"closing {self!r}")

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<xlog_cuda.Runtime device={self.device} backend={self._backend} {state}>"

    # -- queries --

    def stats(self) -> Stats:
        raw = _library.XlogStats.new()
        call(_lib().xlog_get_stats, self._handle, ctypes.byref(raw))
        return Stats(**{field.name: getattr(raw, field.name) for field in dataclasses.fields(Stats)})

    def live_blocks(self) -> List[LiveBlock]:
        """Every live block, by generation: allocation order for the blocks
        of one thread (`xlog_live_blocks`)."""
        out = []
        for e in _fill_array(_lib().xlog_live_blocks, self._handle, _library.XlogLiveBlock):
            b = e.block
            out.append(
                LiveBlock(
                    ptr=b.ptr or 0,
                    size=b.size,
                    device_bytes=e.device_bytes,
                    generation=b.generation,
                    stream=b.stream,
                    device=b.device,
                    tag=_text(e.tag) or "",
                    sequence=e.sequence,
                    allocations_since=e.allocations_since,
                    age_s=None if e.age_ns == U64_MAX else e.age_ns / 1e9,
                    call_site=_text(e.call_site),
                )
            )
        return out

    def tag_stats(self) -> List[TagStats]:
        """Counters per tag, largest live bytes first (`xlog_tag_stats`)."""
        return [
            TagStats(
                tag=_text(e.tag) or "",
                live_bytes=e.live_bytes,
                live_blocks=e.live_blocks,
                peak_bytes=e.peak_bytes,
                allocations=e.allocations,
                frees=e.frees,
            )
            for e in _fill_array(_lib().xlog_tag_stats, self._handle, _library.XlogTagStat)
        ]

    def reset_peak(self) -> None:
        """Restart every peak (peak_outstanding_bytes, peak_live_bytes,
        peak_live_blocks, the per-tag peaks) from its current value."""
        call(_lib().xlog_reset_peak, self._handle)

    def memory_summary(self) -> str:
        """A readable table: totals, per tag, the largest live blocks
        (`xlog_memory_summary`)."""
        lib = _lib()
        needed = ctypes.c_size_t()
        call(lib.xlog_memory_summary, self._handle, None, 0, ctypes.byref(needed))
        while True:
            cap = needed.value
            buf = ctypes.create_string_buffer(cap)
            call(lib.xlog_memory_summary, self._handle, buf, cap, ctypes.byref(needed))
            if needed.value <= cap:
                return buf.value.decode("utf-8", "replace")

    @property
    def tracks_call_sites(self) -> bool:
        """Whether `allocate` records a call site (the runtime's config)."""
        return self._track_call_sites

    def reap(self) -> int:
        """Retire completed frees without blocking; returns the bytes released."""
        out = ctypes.c_uint64()
        call(_lib().xlog_reap, self._handle, ctypes.byref(out))
        return out.value

    def enable_peer_access(self, peer: "Runtime") -> None:
        """Let this runtime's device and `peer`'s (another device) use each
        other's memory (`xlog_enable_peer_access`): afterwards a stream of
        either may be passed to the other's `prepare`/`finish` (and
        `prepare_all`/`finish_all`) for its blocks. Once per device pair;
        calling again does nothing. Raises UnsatisfiableDependencyError,
        naming both devices, where the hardware has no peer access."""
        if not isinstance(peer, Runtime):
            raise _errors.InvalidArgumentError(f"peer must be a Runtime, not {type(peer).__name__}")
        call(_lib().xlog_enable_peer_access, self._handle, peer.handle)

    def trim(self, keep_bytes: int = 0) -> int:
        """Give cached memory back to the driver until at most `keep_bytes`
        stay cached (0: empty every stream's cache, the role of
        `torch.cuda.empty_cache()`); waits for those frees, so the budget
        drops by what was released. Returns the bytes released."""
        keep_bytes = _checked_int("keep_bytes", keep_bytes, 0, U64_MAX)
        out = ctypes.c_uint64()
        call(_lib().xlog_trim, self._handle, keep_bytes, ctypes.byref(out))
        return out.value

    def drain(self) -> int:
        """Wait for every free queued so far, then reap; returns the bytes released."""
        out = ctypes.c_uint64()
        call(_lib().xlog_drain, self._handle, ctypes.byref(out))
        return out.value

    # -- streams --

    def acquire_stream(self) -> "Stream":
        """A stream from the bounded pool (PoolExhaustedError past the pool size)."""
        out = _library.xlog_stream()
        call(_lib().xlog_stream_acquire, self._handle, ctypes.byref(out))
        return Stream(self, out.value)

    def import_stream(self, native: Optional[int]) -> "Stream":
        """Adopt a native `cudaStream_t` given as an int (None or 0: the legacy
        default stream). Releasing the Stream drops the mapping, not the
        native stream."""
        value = 0 if native is None else _checked_int("native", native, 0, U64_MAX)
        out = _library.xlog_stream()
        call(_lib().xlog_stream_import, self._handle, value or None, ctypes.byref(out))
        return Stream(self, out.value)

    # -- blocks --

    def allocate(
        self, nbytes: int, stream: Union["Stream", int], tag: str = "", call_site: Optional[str] = None
    ) -> "Block":
        """Allocate `nbytes` ordered on `stream`; `tag` (a str) names it in
        logs and errors. The library keeps a tag to its first 128 bytes of
        UTF-8 (cut at a character boundary, not refused); a tag that is not
        valid text (a lone surrogate) or holds a NUL byte raises
        InvalidArgumentError.

        With call-site tracking on, the block's call site is `call_site`, or
        when None a summary of the caller's Python traceback
        (`call_site_summary`); without tracking both cost nothing.

        The Block is freed (stream ordered) by `free()`, by leaving its
        `with` block, or when it is garbage-collected.
        """
        nbytes = _checked_int("nbytes", nbytes, 0, U64_MAX)
        if isinstance(tag, str):
            tag_bytes = _utf8("tag", tag)
        elif isinstance(tag, (bytes, bytearray)):
            tag_bytes = bytes(tag)
        else:
            raise InvalidArgumentError(f"tag must be a str, got {type(tag).__name__} ({tag!r})")
        if b"\0" in tag_bytes:
            raise InvalidArgumentError("tag contains a NUL byte")
        raw = _library.XlogBlock()
        if self._track_call_sites:
            if call_site is None:
                # A traceback may name files whose names are not text.
                site_bytes = call_site_summary(2).encode("utf-8", "backslashreplace")
            else:
                site_bytes = _utf8("call_site", str(call_site))
            site_bytes = site_bytes.replace(b"\0", b"?")
            call(
                _lib().xlog_allocate_at,
                self._handle,
                nbytes,
                _stream_id(stream),
                tag_bytes,
                site_bytes,
                ctypes.byref(raw),
            )
        else:
            call(_lib().xlog_allocate, self._handle, nbytes, _stream_id(stream), tag_bytes, ctypes.byref(raw))
        return Block(self, raw)

    def deallocate(self, block: "Block") -> None:
        """`xlog_deallocate` of a handle, regardless of the Block's Python state."""
        call(_lib().xlog_deallocate, self._handle, block._raw)
        block._owner.freed = True

    def prepare_all(self, stream: Union["Stream", int], uses: Sequence[Tuple["Block", Any]]) -> None:
        array, n = _uses_array(uses)
        call(_lib().xlog_prepare_all, self._handle, _stream_id(stream), array, n)

    def finish_all(self, stream: Union["Stream", int], uses: Sequence[Tuple["Block", Any]]) -> None:
        array, n = _uses_array(uses)
        call(_lib().xlog_finish_all, self._handle, _stream_id(stream), array, n)

    # -- testing --

    def sim_inject_fault(self, kind: Union[Fault, int, str], nth: int) -> None:
        """Sim only: make the `nth` next call of `kind` fail (0 disarms)."""
        if isinstance(kind, str):
            try:
                kind = Fault[kind.strip().upper()]
            except KeyError:
                names = ", ".join(repr(f.name.lower()) for f in Fault)
                raise InvalidArgumentError(f"fault {kind!r} is not one of {names}") from None
        kind = _checked_int("kind", int(kind) if isinstance(kind, Fault) else kind, 0, U32_MAX)
        nth = _checked_int("nth", nth, 0, U64_MAX)
        call(_lib().xlog_sim_inject_fault, self._handle, kind, nth)

    def sim_touch(self, stream: "Stream", ptr: int, size: int, claim: str = "check") -> None:
        """Sim only: queue on `stream`, in its order, a check that the `size`
        bytes at `ptr` are mapped with access for the device (what a kernel
        using a block there needs; a GPU faults otherwise). `claim` "take"
        / "give": the block also takes / gives back the physical bytes
        behind it, so physical memory serving two blocks at once in stream
        order, or a block remapped while in use, fails the check. Failures
        are counted: `sim_touch_faults()`."""
        kinds = {"check": 0, "take": 1, "give": 2}
        if claim not in kinds:
            raise InvalidArgumentError(f"claim {claim!r} is not one of {', '.join(map(repr, kinds))}")
        call(_lib().xlog_sim_touch, self._handle, stream.id, _checked_int("ptr", ptr, 0, U64_MAX),
             _checked_int("size", size, 0, U64_MAX), kinds[claim])

    def sim_touch_faults(self) -> Tuple[int, str]:
        """Sim only: how many `sim_touch` checks that have run failed, and
        a message naming the first ("" with none)."""
        count = ctypes.c_uint64(0)
        try:
            call(_lib().xlog_sim_touch_faults, self._handle, ctypes.byref(count))
        except _errors.DriverError as e:
            return count.value, str(e)
        return count.value, ""


def _uses_array(uses: Iterable[Tuple["Block", Any]]):
    items = []
    for i, entry in enumerate(uses):
        try:
            block, access = entry
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"uses[{i}] is not a (Block, Access) pair") from None
        if not isinstance(block, Block):
            raise InvalidArgumentError(f"uses[{i}][0] is a {type(block).__name__}, not a Block")
        items.append(_library.XlogUse(block._raw, _access_value(access)))
    if not items:
        return None, 0
    return (_library.XlogUse * len(items))(*items), len(items)


def launch(
    runtime: Runtime,
    stream: Union["Stream", int],
    uses: Sequence[Tuple["Block", Any]],
    fn: Callable[[], Any],
) -> Any:
    """prepare_all → fn() → finish_all; returns what `fn` returns.

    `fn` enqueues the work on `stream` (a kernel, or `stream.enqueue_host`).
    If `fn` raises, the uses are still recorded (it may have enqueued part
    of its work, and a later free must wait for that) and its exception
    propagates.
    """
    runtime.prepare_all(stream, uses)
    try:
        result = fn()
    except BaseException:
        try:
            runtime.finish_all(stream, uses)
        except _errors.XlogError:
            pass
        raise
    runtime.finish_all(stream, uses)
    return result


# ---------------------------------------------------------------------------
# Stream
# ---------------------------------------------------------------------------


class Stream:
    """A stream id of a runtime; released on `release()` or context exit."""

    def __init__(self, runtime: Runtime, stream_id: int):
        self.runtime = runtime
        self.id = stream_id
        self._released = False
        self._callback_errors: List[BaseException] = []

    def __int__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<xlog_cuda.Stream id={self.id}{' released' if self._released else ''}>"

    @property
    def released(self) -> bool:
        return self._released

    @property
    def native(self) -> int:
        """The native `cudaStream_t` as an int (an opaque token on sim)."""
        out = ctypes.c_void_p()
        call(_lib().xlog_stream_native, self.runtime.handle, self.id, ctypes.byref(out))
        return out.value or 0

    def synchronize(self) -> None:
        """Wait for all work queued on the stream.

        If a host callback enqueued from Python raised, the first such
        exception is re-raised here (and forgotten).
        """
        call(_lib().xlog_stream_synchronize, self.runtime.handle, self.id)
        self.raise_callback_error()

    def raise_callback_error(self) -> None:
        """Re-raise (once) the first exception a host callback of this stream raised."""
        if self._callback_errors:
            error = self._callback_errors.pop(0)
            self._callback_errors.clear()
            raise error

    def enqueue_host(self, fn: Callable[[], Any]) -> None:
        """Run `fn()` on a host thread in stream order.

        `fn` is kept alive until it has run. It runs on a stream worker
        thread; an exception it raises is kept and re-raised by the next
        `synchronize()` of this Stream object. No xlog call is allowed from
        `fn` (each raises StreamMisuseError there: see `in_host_callback`);
        `Block.read`/`write` are, on sim.
        """
        if not callable(fn):
            raise InvalidArgumentError(f"{fn!r} is not callable")
        with _callback_lock:
            key = next(_callback_keys)
            _pending_callbacks[key] = (fn, self._callback_errors)
        try:
            call(_lib().xlog_stream_enqueue_host, self.runtime.handle, self.id, _HOST_TRAMPOLINE, key)
        except BaseException:
            with _callback_lock:
                _pending_callbacks.pop(key, None)
            raise

    def release(self) -> None:
        """Give the stream back (queued work still runs). A second call is a no-op.

        An imported stream is released only once no block of device memory
        allocated on it is live (their frees are ordered on it, and its
        owner may destroy it afterwards): StreamMisuseError, naming them and
        changing nothing, until then."""
        if self._released:
            return
        call(_lib().xlog_stream_release, self.runtime.handle, self.id)
        self._released = True

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        # A closed runtime has already released its streams.
        if self.runtime.closed:
            return
        try:
            self.release()
        except _errors.XlogError as e:
            _note_exit_failure(exc, e, f"releasing {self!r}")


# ---------------------------------------------------------------------------
# DLPack
# ---------------------------------------------------------------------------
#
# The structs of dlpack.h (the unversioned ABI, "dltensor" capsules, which
# every consumer accepts). A view is one DLManagedTensor; this module keeps
# it, its shape array and a strong reference to whatever it views (the
# Block) in `_dlpack_views`, keyed by the struct's address, until its
# deleter runs. The consumer calls the deleter when its tensor goes away;
# a capsule never consumed calls it from its destructor.

KDL_CPU = 1
KDL_CUDA = 2
KDL_UINT = 1  # DLDataTypeCode kDLUInt


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# void (*deleter)(DLManagedTensor *self); the argument is taken as an address.
DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DL_DELETER)]


DLTENSOR_NAME = b"dltensor"
USED_DLTENSOR_NAME = b"used_dltensor"

_dlpack_views: Dict[int, Tuple[Any, DLManagedTensor, Any]] = {}
_dlpack_lock = threading.Lock()


def _dlpack_delete(address: Optional[int]) -> None:
    """The DLManagedTensor deleter: forget the view, dropping its reference
    to the Block (which may then be collected, and freed, as usual)."""
    with _dlpack_lock:
        entry = _dlpack_views.pop(address or 0, None)
    del entry  # outside the lock: the Block's finalizer may run here


_DL_DELETER_FN = DL_DELETER(_dlpack_delete)


def dlpack_views() -> int:
    """DLPack views handed out whose deleter has not run yet (for tests)."""
    with _dlpack_lock:
        return len(_dlpack_views)


def _dlpack_managed(keep: Any, ptr: int, nbytes: int, device_type: int, device_id: int) -> int:
    """Build the DLManagedTensor of a 1-D uint8 view of `nbytes` at `ptr`,
    registered with a strong reference to `keep`; returns its address."""
    managed = DLManagedTensor()
    shape = (ctypes.c_int64 * 1)(nbytes)
    tensor = managed.dl_tensor
    tensor.data = ptr or None
    tensor.device = DLDevice(device_type, device_id)
    tensor.ndim = 1
    tensor.dtype = DLDataType(KDL_UINT, 8, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # NULL: compact row-major
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _DL_DELETER_FN
    address = ctypes.addressof(managed)
    with _dlpack_lock:
        _dlpack_views[address] = (keep, managed, shape)
    return address


# The capsule destructor reads the capsule with PyCapsule_IsValid and
# PyCapsule_GetPointer (through a CDLL binding, which does not look for a
# pending Python exception after the call: a capsule may be destroyed while
# one is propagating). Both only read the capsule, and GetPointer is called
# only on a name IsValid accepted, so neither sets an error.
PY_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_api = ctypes.CDLL(None) if sys.platform != "win32" else ctypes.pythonapi
_capsule_is_valid = _capsule_api.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = _capsule_api.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, PY_CAPSULE_DESTRUCTOR]


def _capsule_destructor(capsule: Optional[int]) -> None:
    # Still named "dltensor": no consumer took it, so its deleter is ours to
    # call. A consumer renames it "used_dltensor" and calls the deleter itself.
    if capsule and _capsule_is_valid(capsule, DLTENSOR_NAME):
        _dlpack_delete(_capsule_pointer(capsule, DLTENSOR_NAME))


_CAPSULE_DESTRUCTOR_FN = PY_CAPSULE_DESTRUCTOR(_capsule_destructor)


def _dlpack_capsule(keep: Any, ptr: int, nbytes: int, device_type: int, device_id: int) -> Any:
    """A "dltensor" PyCapsule over a new DLManagedTensor (see `_dlpack_managed`)."""
    address = _dlpack_managed(keep, ptr, nbytes, device_type, device_id)
    try:
        # DLTENSOR_NAME is a module constant: the capsule keeps its pointer.
        return _capsule_new(address, DLTENSOR_NAME, _CAPSULE_DESTRUCTOR_FN)
    except BaseException:
        _dlpack_delete(address)
        raise


def _consumer_native_stream(stream: Any) -> Optional[int]:
    """The native stream a DLPack consumer names (CUDA rules of the
    protocol), or None for -1 (the consumer asks for no synchronization)."""
    if stream is None:
        return 0  # the legacy default stream
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise InvalidArgumentError(f"__dlpack__ stream must be an int or None, got {type(stream).__name__}")
    if stream == 1:
        return 0
    if stream == -1:
        return None
    if stream == 0 or stream < -1:
        raise InvalidArgumentError(
            f"__dlpack__ stream = {stream} is not allowed on CUDA (None or 1: legacy default stream, "
            "2: per-thread default stream, -1: no synchronization, else a cudaStream_t)"
        )
    return stream  # 2 is cudaStreamPerThread, which the driver takes as is


# ---------------------------------------------------------------------------
# Block
# ---------------------------------------------------------------------------


class _BlockOwner:
    """What the copies of one Block share: whether its C handle has been
    freed. When the last copy is collected, an unfreed block is freed."""

    __slots__ = ("runtime", "raw", "freed")

    def __init__(self, runtime: Runtime, raw: _library.XlogBlock):
        self.runtime = runtime
        self.raw = raw
        self.freed = False

    def __del__(self) -> None:
        if not self.freed:
            self.freed = True
            _free_collected(self.runtime, self.raw)


class Block:
    """A block handle; freed on `free()`, on context exit, or when the last
    copy of it is garbage-collected.

    `free()` is idempotent on this object. `copy()` gives a second object
    with the same C handle: freeing both reaches the library twice, and the
    second free raises UseAfterFreeError, as with a copied `xlog_block` in C.
    A block no copy refers to any more is freed as `free()` would (stream
    ordered); one whose runtime is closed was freed by the close.
    """

    def __init__(self, runtime: Runtime, raw: _library.XlogBlock, owner: Optional[_BlockOwner] = None):
        self.runtime = runtime
        self._raw = _library.XlogBlock.from_buffer_copy(raw)
        self._freed = False
        self._owner = owner if owner is not None else _BlockOwner(runtime, self._raw)

    # -- handle fields --

    @property
    def ptr(self) -> int:
        """Device address as an int (host memory on sim); 0 for 0 bytes."""
        return self._raw.ptr or 0

    @property
    def size(self) -> int:
        return self._raw.size

    @property
    def generation(self) -> int:
        return self._raw.generation

    @property
    def stream(self) -> int:
        """Id of the allocation stream."""
        return self._raw.stream

    @property
    def device(self) -> int:
        return self._raw.device

    @property
    def handle(self) -> _library.XlogBlock:
        """A copy of the C `xlog_block`."""
        return _library.XlogBlock.from_buffer_copy(self._raw)

    @property
    def freed(self) -> bool:
        return self._freed

    def __repr__(self) -> str:
        return (
            f"<xlog_cuda.Block ptr={self.ptr:#x} size={self.size} generation={self.generation} "
            f"stream={self.stream}{' freed' if self._freed else ''}>"
        )

    def copy(self) -> "Block":
        return Block(self.runtime, self._raw, self._owner)

    __copy__ = copy

    # -- operations --

    def free(self) -> None:
        """Free the block (stream ordered). A second call on this object is a no-op."""
        if self._freed:
            return
        call(_lib().xlog_deallocate, self.runtime.handle, self._raw)
        self._freed = True
        self._owner.freed = True

    def validate(self) -> None:
        """Raise unless the handle names a live block (UseAfterFreeError if freed)."""
        call(_lib().xlog_block_validate, self.runtime.handle, self._raw)

    def prepare(self, stream: Union["Stream", int], access: Union[Access, int, str]) -> None:
        call(_lib().xlog_prepare, self.runtime.handle, self._raw, _stream_id(stream), _access_value(access))

    def finish(self, stream: Union["Stream", int], access: Union[Access, int, str]) -> None:
        call(_lib().xlog_finish, self.runtime.handle, self._raw, _stream_id(stream), _access_value(access))

    # -- views for other libraries --
    #
    # CUDA backend only: on sim the memory is host memory, and each of these
    # raises HostMemoryError, an AttributeError too, so hasattr() of
    # `__cuda_array_interface__` is False there. A view keeps this Block
    # object alive (CuPy and Numba hold the object they read the interface
    # from; a DLPack capsule holds it until its deleter runs), so the block
    # is not freed by garbage collection while a view exists. An explicit
    # `free()` (or closing the runtime) while a view exists is the caller's
    # error, as freeing memory under any pointer is.

    def _require_device_memory(self, what: str) -> None:
        if self.runtime.backend != "cuda":
            raise _errors.HostMemoryError(
                f"{what}: {self!r} lives on the {self.runtime.backend} backend, whose memory is host "
                "memory, not device memory; no CUDA view of it exists (Block.read/write copy its bytes)"
            )

    def _native_stream(self) -> int:
        out = ctypes.c_void_p()
        call(_lib().xlog_stream_native, self.runtime.handle, self.stream, ctypes.byref(out))
        return out.value or 0

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """CUDA Array Interface v3: the block as a 1-D uint8 array.

        `stream` is the block's allocation stream (its native handle; 1 for
        the legacy default stream). Before returning, that stream is made to
        wait for the uses xlog recorded on other streams, so the data is
        valid on it; a consumer that synchronizes on it (CuPy and Numba do
        by default) sees every write made through xlog launches. Raises
        HostMemoryError (an AttributeError) on sim.
        """
        self._require_device_memory("__cuda_array_interface__")
        native = self._native_stream()
        self.prepare(self.stream, Access.READ_WRITE)
        return {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": native if native else 1,
        }

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(kDLCUDA = 2, device ordinal). HostMemoryError on sim."""
        self._require_device_memory("__dlpack_device__")
        return (KDL_CUDA, self.device)

    def __dlpack__(
        self,
        stream: Any = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A "dltensor" capsule: a 1-D uint8 DLPack tensor over the block.

        `stream` is the consumer's (DLPack rules for CUDA: None or 1 the
        legacy default stream, 2 the per-thread default stream, -1 no
        synchronization, else a `cudaStream_t` as an int). That stream is
        imported and made to wait (`xlog_prepare`, read-write: the view is
        writable) for the block's allocation stream and every use xlog
        recorded on other streams. The capsule is the unversioned kind
        whatever `max_version` asks (the protocol lets a producer answer an
        older version); `copy=True` and any `dl_device` but this block's
        raise BufferError: a view never copies. The capsule, and then the
        consumer's tensor, hold this Block alive until the tensor's deleter
        runs. Work the consumer queues later is not recorded by xlog: before
        freeing the block, synchronize the consumer's stream or record that
        work with `finish(stream, access)`. HostMemoryError on sim.
        """
        self._require_device_memory("__dlpack__")
        if copy:
            raise BufferError("an xlog block's DLPack export is a view; copy=True cannot be honored")
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device):
            raise BufferError(f"dl_device {tuple(dl_device)!r}: the block lives on {(KDL_CUDA, self.device)!r}")
        native = _consumer_native_stream(stream)
        if native is not None:
            consumer = self.runtime.import_stream(native)
            # The imported id stays mapped: the caller may have imported the
            # same native stream and would lose its id to a release here.
            self.prepare(consumer, Access.READ_WRITE)
        else:
            self.validate()
        return _dlpack_capsule(self, self.ptr, self.size, KDL_CUDA, self.device)

    # -- sim memory --

    def _host_range(self, offset: int, n: int) -> int:
        if self.runtime.backend != "sim":
            raise InvalidArgumentError(
                f"Block.read/write need the sim backend (this runtime runs on {self.runtime.backend})"
            )
        offset = _checked_int("offset", offset, 0, U64_MAX)
        n = _checked_int("n", n, 0, U64_MAX)
        if offset + n > self.size:
            raise InvalidArgumentError(f"{n} bytes at offset {offset} exceed the block's {self.size} bytes")
        # A stale handle must not touch memory that now belongs to another
        # block. Inside a host callback the library cannot be asked (no xlog
        # call is allowed there): what this package knows has to do.
        if in_host_callback():
            if self._owner.freed or self.runtime.closed:
                raise _errors.UseAfterFreeError(f"{self!r} was freed (or its runtime closed)")
        else:
            self.validate()
        return self.ptr + offset

    def read(self, n: Optional[int] = None, offset: int = 0) -> bytes:
        """Sim only: copy `n` bytes (default: to the end) from `offset`.

        Plain host access, unordered with respect to streams: call it after
        `synchronize()` or from a host callback enqueued in order.
        """
        if n is None:
            n = self.size - offset if isinstance(offset, int) and 0 <= offset <= self.size else 0
        address = self._host_range(offset, n)
        return ctypes.string_at(address, n) if n else b""

    def write(self, data: Union[bytes, bytearray, memoryview], offset: int = 0) -> None:
        """Sim only: copy `data` into the block at `offset` (same ordering rules as `read`)."""
        payload = bytes(data)
        address = self._host_range(offset, len(payload))
        if payload:
            ctypes.memmove(address, payload, len(payload))

    # -- context manager --

    def __enter__(self) -> "Block":
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        # A closed runtime has already freed what was live.
        if self.runtime.closed:
            return
        try:
            self.free()
        except _errors.XlogError as e:
            _note_exit_failure(exc, e, f"freeing {self!r}")

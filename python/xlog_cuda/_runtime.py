"""Runtime, Stream and Block: owning Python objects over the C handles."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import itertools
import threading
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _errors, _library
from ._config import U32_MAX, U64_MAX, Config
from ._errors import InvalidArgumentError, check

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
    """A snapshot of `xlog_stats`."""

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
    log_lines_lost: int


class LeakReport(NamedTuple):
    """What a close found still live (and freed on the caller's behalf)."""

    blocks: int
    bytes: int


def _lib() -> ctypes.CDLL:
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


def _run_host_callback(user: Optional[int]) -> None:
    with _callback_lock:
        entry = _pending_callbacks.pop(user or 0, None)
    if entry is None:
        return
    fn, errors = entry
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
        errors.append(e)


_HOST_TRAMPOLINE = _library.HOST_FN(_run_host_callback)


def pending_host_callbacks() -> int:
    """Callbacks enqueued from Python that have not run yet (for tests)."""
    with _callback_lock:
        return len(_pending_callbacks)


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

    def __init__(self, device: int = 0, config: Optional[Config] = None, **overrides: Any):
        if config is None:
            config = Config.from_env()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.device = _checked_int("device", device, I32_MIN, I32_MAX)
        self.config = config
        raw = config.to_c()
        handle = ctypes.c_void_p()
        lib = _lib()
        check(lib.xlog_runtime_open(self.device, ctypes.byref(raw), ctypes.byref(handle)))
        self._adopt_handle(handle.value or 0)

    def _adopt_handle(self, handle: int) -> None:
        """Own an open `xlog_runtime*` token (closing it if it is unusable)."""
        lib = _lib()
        self._handle: int = handle
        self._close_report: Optional[LeakReport] = None
        code = _library.xlog_backend()
        try:
            check(lib.xlog_runtime_backend(self._handle, ctypes.byref(code)))
        except BaseException:
            lib.xlog_runtime_close(self._handle)
            raise
        self._backend = {1: "cuda", 2: "sim"}.get(code.value, str(code.value))

    @classmethod
    def _from_handle(cls, handle: int, device: int, config: Optional[Config] = None) -> "Runtime":
        """A Runtime owning a handle opened elsewhere (e.g. xlog_interop_runtime)."""
        self = cls.__new__(cls)
        self.device = device
        self.config = config
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
        """Close the runtime; returns the blocks and bytes still live.

        The library frees leaked blocks, waits for pending frees and stops the
        streams. Closing again returns the first report without a C call.
        """
        if self._close_report is not None:
            return self._close_report
        blocks, nbytes = ctypes.c_uint64(), ctypes.c_uint64()
        status = _lib().xlog_runtime_close_report(self._handle, ctypes.byref(blocks), ctypes.byref(nbytes))
        # The handle is invalid afterwards even if an error is returned.
        self._close_report = LeakReport(blocks.value, nbytes.value)
        check(status)
        return self._close_report

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<xlog_cuda.Runtime device={self.device} backend={self._backend} {state}>"

    # -- queries --

    def stats(self) -> Stats:
        raw = _library.XlogStats()
        check(_lib().xlog_get_stats(self._handle, ctypes.byref(raw)))
        return Stats(**{name: getattr(raw, name) for name, _ in _library.XlogStats._fields_})

    def reap(self) -> int:
        """Retire completed frees without blocking; returns the bytes released."""
        out = ctypes.c_uint64()
        check(_lib().xlog_reap(self._handle, ctypes.byref(out)))
        return out.value

    def drain(self) -> int:
        """Wait for every free queued so far, then reap; returns the bytes released."""
        out = ctypes.c_uint64()
        check(_lib().xlog_drain(self._handle, ctypes.byref(out)))
        return out.value

    # -- streams --

    def acquire_stream(self) -> "Stream":
        """A stream from the bounded pool (PoolExhaustedError past the pool size)."""
        out = _library.xlog_stream()
        check(_lib().xlog_stream_acquire(self._handle, ctypes.byref(out)))
        return Stream(self, out.value)

    def import_stream(self, native: Optional[int]) -> "Stream":
        """Adopt a native `cudaStream_t` given as an int (None or 0: the legacy
        default stream). Releasing the Stream drops the mapping, not the
        native stream."""
        value = 0 if native is None else _checked_int("native", native, 0, U64_MAX)
        out = _library.xlog_stream()
        check(_lib().xlog_stream_import(self._handle, value or None, ctypes.byref(out)))
        return Stream(self, out.value)

    # -- blocks --

    def allocate(self, nbytes: int, stream: Union["Stream", int], tag: str = "") -> "Block":
        """Allocate `nbytes` ordered on `stream`; `tag` names it in logs and errors."""
        nbytes = _checked_int("nbytes", nbytes, 0, U64_MAX)
        tag_bytes = tag.encode("utf-8") if isinstance(tag, str) else bytes(tag)
        if b"\0" in tag_bytes:
            raise InvalidArgumentError("tag contains a NUL byte")
        raw = _library.XlogBlock()
        check(_lib().xlog_allocate(self._handle, nbytes, _stream_id(stream), tag_bytes, ctypes.byref(raw)))
        return Block(self, raw)

    def deallocate(self, block: "Block") -> None:
        """`xlog_deallocate` of a handle, regardless of the Block's Python state."""
        check(_lib().xlog_deallocate(self._handle, block._raw))

    def prepare_all(self, stream: Union["Stream", int], uses: Sequence[Tuple["Block", Any]]) -> None:
        array, n = _uses_array(uses)
        check(_lib().xlog_prepare_all(self._handle, _stream_id(stream), array, n))

    def finish_all(self, stream: Union["Stream", int], uses: Sequence[Tuple["Block", Any]]) -> None:
        array, n = _uses_array(uses)
        check(_lib().xlog_finish_all(self._handle, _stream_id(stream), array, n))

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
        check(_lib().xlog_sim_inject_fault(self._handle, kind, nth))


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
        check(_lib().xlog_stream_native(self.runtime.handle, self.id, ctypes.byref(out)))
        return out.value or 0

    def synchronize(self) -> None:
        """Wait for all work queued on the stream.

        If a host callback enqueued from Python raised, the first such
        exception is re-raised here (and forgotten).
        """
        check(_lib().xlog_stream_synchronize(self.runtime.handle, self.id))
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
        `synchronize()` of this Stream object.
        """
        if not callable(fn):
            raise InvalidArgumentError(f"{fn!r} is not callable")
        with _callback_lock:
            key = next(_callback_keys)
            _pending_callbacks[key] = (fn, self._callback_errors)
        status = _lib().xlog_stream_enqueue_host(self.runtime.handle, self.id, _HOST_TRAMPOLINE, key)
        if status != _errors.Status.OK:
            with _callback_lock:
                _pending_callbacks.pop(key, None)
            check(status)

    def release(self) -> None:
        """Give the stream back (queued work still runs). A second call is a no-op."""
        if self._released:
            return
        check(_lib().xlog_stream_release(self.runtime.handle, self.id))
        self._released = True

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        # A closed runtime has already released its streams.
        if not self.runtime.closed:
            self.release()


# ---------------------------------------------------------------------------
# Block
# ---------------------------------------------------------------------------


class Block:
    """A block handle; freed on `free()` or context exit.

    `free()` is idempotent on this object. `copy()` gives a second object
    with the same C handle: freeing both reaches the library twice, and the
    second free raises UseAfterFreeError, as with a copied `xlog_block` in C.
    """

    def __init__(self, runtime: Runtime, raw: _library.XlogBlock):
        self.runtime = runtime
        self._raw = _library.XlogBlock.from_buffer_copy(raw)
        self._freed = False

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
        return Block(self.runtime, self._raw)

    __copy__ = copy

    # -- operations --

    def free(self) -> None:
        """Free the block (stream ordered). A second call on this object is a no-op."""
        if self._freed:
            return
        check(_lib().xlog_deallocate(self.runtime.handle, self._raw))
        self._freed = True

    def validate(self) -> None:
        """Raise unless the handle names a live block (UseAfterFreeError if freed)."""
        check(_lib().xlog_block_validate(self.runtime.handle, self._raw))

    def prepare(self, stream: Union["Stream", int], access: Union[Access, int, str]) -> None:
        check(_lib().xlog_prepare(self.runtime.handle, self._raw, _stream_id(stream), _access_value(access)))

    def finish(self, stream: Union["Stream", int], access: Union[Access, int, str]) -> None:
        check(_lib().xlog_finish(self.runtime.handle, self._raw, _stream_id(stream), _access_value(access)))

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
        # A stale handle must not touch memory that now belongs to another block.
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

    def __exit__(self, *exc: Any) -> None:
        # A closed runtime has already freed what was live.
        if not self.runtime.closed:
            self.free()

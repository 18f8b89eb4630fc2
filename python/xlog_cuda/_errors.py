"""Status codes and the exception raised for each of them."""

from __future__ import annotations

import ctypes
import enum
import threading
from typing import Any, Callable, Dict, Optional, Tuple, Type

from . import _library


class Status(enum.IntEnum):
    """`xlog_status` values. They never change meaning."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_BUDGET = 2
    OUT_OF_MEMORY = 3
    DRIVER = 4
    STREAM_MISUSE = 5
    USE_AFTER_FREE = 6
    UNSATISFIABLE_DEPENDENCY = 7
    POOL_EXHAUSTED = 8
    NO_DEVICE = 9
    INTERNAL = 10

    @property
    def c_name(self) -> str:
        """The C constant's name as the library reports it (xlog_status_name)."""
        return status_name(int(self))


def status_name(status: int) -> str:
    """`xlog_status_name`: "XLOG_ERR_OUT_OF_BUDGET", or "XLOG_STATUS_UNKNOWN"."""
    return _library.load().xlog_status_name(status).decode()


def last_error() -> str:
    """This thread's last error message from the library ("" after a success)."""
    lib = _library.load()
    needed = lib.xlog_last_error_message(None, 0)
    if needed == 0:
        return ""
    buf = ctypes.create_string_buffer(needed + 1)
    lib.xlog_last_error_message(buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


class XlogError(Exception):
    """An error status from libxlog_cuda.

    `status` is the `Status`; `message` is the library's message (the
    thread's last error at the time of the failing call).
    """

    status: Status = Status.INTERNAL

    def __init__(self, message: str, status: Optional[int] = None):
        if status is not None:
            try:
                self.status = Status(status)
            except ValueError:
                # An unknown code from a newer library: keep the number.
                self.status = status  # type: ignore[assignment]
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else f"status {self.status}"
        return f"[{name}] {self.message}"


class InvalidArgumentError(XlogError, ValueError):
    status = Status.INVALID_ARGUMENT


class HostMemoryError(InvalidArgumentError, AttributeError):
    """A device-memory view (`__cuda_array_interface__`, `__dlpack__`,
    `__dlpack_device__`) asked of a block on the sim backend, whose memory
    is host memory. An InvalidArgumentError, and an AttributeError too, so
    `hasattr(block, "__cuda_array_interface__")` is False on sim: CuPy,
    Numba and PyTorch probe for the interface that way and then look for
    another way in rather than taking host memory for device memory."""


# Both refusals are MemoryErrors, as CuPy's and PyTorch's out-of-memory
# errors are, so `except MemoryError:` code written for those frameworks
# also catches xlog's; `except xc.XlogError:` still catches them too.


class OutOfBudgetError(XlogError, MemoryError):
    """The budget refused an allocation (the message names requested, live,
    cached, pending and limit). A `MemoryError`."""

    status = Status.OUT_OF_BUDGET


class OutOfMemoryError(XlogError, MemoryError):
    """The device (or the sim's capacity) refused an allocation. A
    `MemoryError`."""

    status = Status.OUT_OF_MEMORY


class DriverError(XlogError):
    status = Status.DRIVER


class StreamMisuseError(XlogError):
    status = Status.STREAM_MISUSE


class UseAfterFreeError(XlogError):
    status = Status.USE_AFTER_FREE


class UnsatisfiableDependencyError(XlogError):
    status = Status.UNSATISFIABLE_DEPENDENCY


class PoolExhaustedError(XlogError):
    status = Status.POOL_EXHAUSTED


class NoDeviceError(XlogError):
    status = Status.NO_DEVICE


class InternalError(XlogError):
    status = Status.INTERNAL


ERROR_CLASSES: Dict[Status, Type[XlogError]] = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        OutOfBudgetError,
        OutOfMemoryError,
        DriverError,
        StreamMisuseError,
        UseAfterFreeError,
        UnsatisfiableDependencyError,
        PoolExhaustedError,
        NoDeviceError,
        InternalError,
    )
}


def error_for(status: int, message: str) -> XlogError:
    """The exception for a non-OK status (XlogError for an unknown code)."""
    try:
        cls = ERROR_CLASSES[Status(status)]
    except (ValueError, KeyError):
        return XlogError(message, status)
    return cls(message)


def check(status: int) -> None:
    """Raise the matching exception for a status returned by the library.

    Must run right after the call, on the same thread, before any other
    library call that could replace the thread's last error (prefer `call`,
    which also keeps finalizers from making one in between).
    """
    if status != Status.OK:
        raise error_for(status, last_error())


# Calls in progress on this thread: from a library call until its message
# has been read. Finalizers (a Block or Runtime collected by the garbage
# collector, which may run at any allocation) must not call the library in
# that window, or they would replace the message; they defer instead (see
# _runtime.py).
_calls = threading.local()


def in_call() -> bool:
    """Whether this thread is between a library call and the read of its
    error message (see `call`)."""
    return getattr(_calls, "depth", 0) > 0


def call_status(fn: Callable[..., int], *args: Any) -> Tuple[int, str]:
    """Call `fn(*args)`, a library function returning a status, and read
    this thread's message right after a failure: (status, message)."""
    _calls.depth = getattr(_calls, "depth", 0) + 1
    try:
        status = fn(*args)
        return status, ("" if status == Status.OK else last_error())
    finally:
        _calls.depth -= 1


def call(fn: Callable[..., int], *args: Any) -> None:
    """Call `fn(*args)` and raise the matching exception if it fails."""
    status, message = call_status(fn, *args)
    if status != Status.OK:
        raise error_for(status, message)

"""`Config` and the byte-size parser shared with the environment variables."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import os
from typing import Optional, Union

from . import _errors, _library

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

DEFAULT_STREAM_POOL_SIZE = 16
DEFAULT_SIM_CAPACITY = 1 << 30


class Backend(enum.IntEnum):
    AUTO = 0
    CUDA = 1
    SIM = 2


class Allocator(enum.IntEnum):
    ASYNC = 0
    DIRECT = 1


# Every unit as (twos, fives): 2**twos * 5**fives bytes.
_SIZE_UNITS = {
    "": (0, 0),
    "b": (0, 0),
    "kb": (3, 3),
    "mb": (6, 6),
    "gb": (9, 9),
    "tb": (12, 12),
    "k": (10, 0),
    "kib": (10, 0),
    "m": (20, 0),
    "mib": (20, 0),
    "g": (30, 0),
    "gib": (30, 0),
    "t": (40, 0),
    "tib": (40, 0),
}


def parse_size(text: str) -> int:
    """Parse a byte count exactly as the library parses XLOG_BUDGET_BYTES.

    A plain integer, or a number with a unit: B; KB/MB/GB/TB (powers of
    1000); K/M/G/T and KiB/MiB/GiB/TiB (powers of 1024); units are case
    insensitive. A fraction is accepted when the result is a whole number of
    bytes ("1.5GiB"). The value is exact (no floating point:
    "9007199254740993.0" is 9007199254740993). Raises ValueError otherwise,
    if it exceeds 64 bits, or for a fraction of more than 38 digits.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    t = text.strip()
    split = len(t)
    for i, ch in enumerate(t):
        if ch not in "0123456789.":
            split = i
            break
    number, unit = t[:split], t[split:].strip()
    if not number:
        raise ValueError(f"{text!r}: expected a number of bytes such as 536870912, 512MiB or 8GiB")
    factors = _SIZE_UNITS.get(unit.lower())
    if factors is None:
        raise ValueError(f"{text!r}: unknown unit {unit!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    twos, fives = factors
    whole, _, fraction = number.partition(".")
    if "." in fraction or (not whole and not fraction):
        raise ValueError(f"{text!r}: {number!r} is not a number")
    too_big = ValueError(f"{text!r}: value does not fit in 64 bits")
    # Checking the digit count first keeps int() clear of Python's limit on
    # digits (leading zeros do not count, nor trailing zeros of a fraction).
    whole_digits = whole.lstrip("0")
    if len(whole_digits) > 20:
        raise too_big
    value = int(whole_digits or "0") * 2**twos * 5**fives
    fraction_digits = fraction.rstrip("0")
    if fraction_digits:
        if len(fraction_digits) > 38:
            raise ValueError(f"{text!r} has more than 38 fractional digits")
        k = len(fraction_digits)
        # f / 10**k * 2**twos * 5**fives is whole exactly when f supplies the
        # 2s and 5s the unit lacks.
        f = int(fraction_digits)
        divisor = 2 ** max(k - twos, 0) * 5 ** max(k - fives, 0)
        if f % divisor:
            raise ValueError(f"{text!r} is not a whole number of bytes")
        value += f // divisor * 2 ** max(twos - k, 0) * 5 ** max(fives - k, 0)
    if value > U64_MAX:
        raise too_big
    return value


SizeLike = Union[int, str]


def parse_threshold(text: str) -> int:
    """Parse a pool release threshold as the library parses
    XLOG_POOL_RELEASE_THRESHOLD: "max" (any case; keep all freed memory
    mapped, 2**64-1) or a size accepted by `parse_size`."""
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    if text.strip().lower() == "max":
        return U64_MAX
    try:
        return parse_size(text)
    except ValueError as e:
        raise ValueError(f"{e}, or max") from None


def _size_value(name: str, value: SizeLike) -> int:
    if isinstance(value, bool):
        raise _errors.InvalidArgumentError(f"{name} must be a byte count, not a bool")
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError as e:
            raise _errors.InvalidArgumentError(f"{name}: {e}") from None
    if not isinstance(value, int):
        raise _errors.InvalidArgumentError(f"{name} must be an int or a size string, got {type(value).__name__}")
    if not 0 <= value <= U64_MAX:
        raise _errors.InvalidArgumentError(f"{name} = {value} is outside 0..2**64-1")
    return value


def _threshold_value(name: str, value: SizeLike) -> int:
    if isinstance(value, str) and value.strip().lower() == "max":
        return U64_MAX
    return _size_value(name, value)


def _flag_value(name: str, value) -> int:
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return int(value)
    raise _errors.InvalidArgumentError(f"{name} {value!r} must be a bool")


def _enum_value(name: str, kind: type, value) -> int:
    """A Backend/Allocator member from its name ('sim'), member or number.

    Numbers outside the enum are passed through so that the library's own
    check (and message) applies; only values that cannot be a uint32 stop here.
    """
    if isinstance(value, str):
        try:
            return int(kind[value.strip().upper()])
        except KeyError:
            names = ", ".join(repr(m.name.lower()) for m in kind)
            raise _errors.InvalidArgumentError(f"{name} {value!r} is not one of {names}") from None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U32_MAX:
        return int(value)
    raise _errors.InvalidArgumentError(f"{name} {value!r} is not a valid {kind.__name__}")



# `xlog_config.memory` (XLOG_MEMORY_ARENA, XLOG_MEMORY_POOL).
_MEMORY_CODES = {"arena": 0, "pool": 1}
_MEMORY_NAMES = {v: k for k, v in _MEMORY_CODES.items()}

@dataclasses.dataclass
class Config:
    """Runtime configuration (the fields of `xlog_config`).

    `Config()` holds the library defaults and ignores the environment;
    `Config.from_env()` applies XLOG_BACKEND, XLOG_BUDGET_BYTES,
    XLOG_LOG_PATH, XLOG_CACHE, XLOG_POOL_RELEASE_THRESHOLD and
    XLOG_TRACK_CALLSITES on top of them, exactly as the C library does.

    `cache` keeps freed blocks in per-stream caches for reuse (async
    allocator; False frees every block to the driver).
    `pool_release_threshold` is the freed memory (bytes, a size string, or
    "max" = keep all, the default) xlog's driver pool keeps mapped at
    synchronisation points.
    `track_call_sites` records where each block was allocated for
    `Runtime.live_blocks()` (a Python traceback summary for blocks allocated
    from Python); off by default.
    `sim_devices` is how many devices the sim backend simulates (env
    `XLOG_SIM_DEVICES`, default 1); ignored on CUDA.
    `memory` is where the async allocator's memory comes from: "arena"
    (the default, xlog's own memory on the virtual-memory API) or "pool"
    (the driver's stream-ordered pool); its default is the environment's
    `XLOG_MEMORY` when set.
    """

    backend: Union[str, Backend] = "auto"
    allocator: Union[str, Allocator] = "async"
    budget_bytes: SizeLike = 0
    stream_pool_size: int = DEFAULT_STREAM_POOL_SIZE
    log_path: Optional[Union[str, os.PathLike]] = None
    sim_capacity_bytes: SizeLike = DEFAULT_SIM_CAPACITY
    wait_on_pressure: bool = False
    cache: bool = True
    pool_release_threshold: SizeLike = U64_MAX
    track_call_sites: bool = False
    sim_devices: int = 1
    # The environment's XLOG_MEMORY (as xlog_config_init reads it), else
    # the arena.
    memory: str = dataclasses.field(default_factory=lambda: os.environ.get("XLOG_MEMORY", "arena").strip() or "arena")

    @classmethod
    def from_env(cls) -> "Config":
        """Library defaults plus the environment (`xlog_config_from_env`).

        A malformed variable raises InvalidArgumentError naming it.
        """
        raw = _library.XlogConfig()
        lib = _library.load()
        _errors.call(lib.xlog_config_from_env, ctypes.byref(raw))
        return cls._from_c(raw)

    @classmethod
    def _from_c(cls, raw: _library.XlogConfig) -> "Config":
        def name_of(kind, code):
            try:
                return kind(code).name.lower()
            except ValueError:
                return code

        return cls(
            backend=name_of(Backend, raw.backend),
            allocator=name_of(Allocator, raw.allocator),
            budget_bytes=raw.budget_bytes,
            stream_pool_size=raw.stream_pool_size,
            log_path=os.fsdecode(raw.log_path) if raw.log_path else None,
            sim_capacity_bytes=raw.sim_capacity_bytes,
            wait_on_pressure=bool(raw.wait_on_pressure),
            cache=bool(raw.cache),
            pool_release_threshold=raw.pool_release_threshold,
            track_call_sites=bool(raw.track_call_sites),
            sim_devices=raw.sim_devices,
            memory=_MEMORY_NAMES.get(raw.memory, raw.memory),
        )

    def to_c(self) -> _library.XlogConfig:
        """The `xlog_config` for this config.

        The returned structure points into a bytes object kept on it
        (`_log_path_bytes`); keep the structure alive while it is used.
        """
        pool = self.stream_pool_size
        if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool <= U32_MAX:
            raise _errors.InvalidArgumentError(f"stream_pool_size {pool!r} is not a uint32")
        wait_on_pressure = _flag_value("wait_on_pressure", self.wait_on_pressure)
        cache = _flag_value("cache", self.cache)
        track_call_sites = _flag_value("track_call_sites", self.track_call_sites)
        sim_devices = self.sim_devices
        if isinstance(sim_devices, bool) or not isinstance(sim_devices, int) or not 0 <= sim_devices <= U32_MAX:
            raise _errors.InvalidArgumentError(f"sim_devices {sim_devices!r} is not a uint32")
        if self.memory not in _MEMORY_CODES:
            raise _errors.InvalidArgumentError(f"memory {self.memory!r} is not one of {sorted(_MEMORY_CODES)}")
        log_bytes = None
        if self.log_path is not None:
            log_bytes = os.fsencode(self.log_path)
            if b"\0" in log_bytes:
                raise _errors.InvalidArgumentError("log_path contains a NUL byte")
        raw = _library.XlogConfig(
            struct_size=ctypes.sizeof(_library.XlogConfig),
            backend=_enum_value("backend", Backend, self.backend),
            allocator=_enum_value("allocator", Allocator, self.allocator),
            budget_bytes=_size_value("budget_bytes", self.budget_bytes),
            stream_pool_size=pool,
            log_path=log_bytes,
            sim_capacity_bytes=_size_value("sim_capacity_bytes", self.sim_capacity_bytes),
            wait_on_pressure=wait_on_pressure,
            cache=cache,
            pool_release_threshold=_threshold_value("pool_release_threshold", self.pool_release_threshold),
            track_call_sites=track_call_sites,
            sim_devices=sim_devices,
            memory=_MEMORY_CODES[self.memory],
        )
        raw._log_path_bytes = log_bytes  # keeps the C string alive
        return raw

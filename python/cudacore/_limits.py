"""Device limits: ``d.limits.malloc_heap_size = 256 << 20``, read back and checked.

The driver clamps some requests without saying so (a 64 TiB malloc heap on an H100 returns success and
applies 17,681,179,680 bytes). Every set here reads the value back: a difference is a
:class:`LimitClampedWarning` with both numbers, or an :class:`InvalidValueError` in strict mode.
"""

from __future__ import annotations

import contextlib
import json
import operator
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import _tables
from ._api import core
from ._errors import CUDAError, error

# The overrides in force, by (device ordinal, limit name): the value before the first of them, and each
# block's (token, value), oldest first. Guarded by _OVERRIDES_LOCK, which is also held while a limit is
# set or restored for an override, so that the driver's value always matches the newest entry.
_OVERRIDES: dict[tuple[int, str], tuple[int, list[tuple[object, int]]]] = {}
_OVERRIDES_LOCK = threading.RLock()

if TYPE_CHECKING:
    from ._device import Device

__all__ = ["LIMIT_NAMES", "LimitClampedWarning", "Limits", "limits_for"]

#: Every limit, in the order ``cudacore doctor`` shows them (Go's list, pkg/limits, through the generated tables).
LIMIT_NAMES: tuple[str, ...] = _tables.LIMIT_NAMES

_INT64_MAX = (1 << 63) - 1


class LimitClampedWarning(UserWarning):
    """The driver applied a different value than the one asked for (it clamps silently).

    Attributes
    ----------
    name : str
        The limit, for example ``"malloc_heap_size"``.
    requested, applied : int
        What was asked for, and what the driver reports after the call.
    device : int
        The device ordinal.
    """

    def __init__(
        self, message: str, *, name: str = "", requested: int = 0, applied: int = 0, device: int = 0
    ) -> None:
        super().__init__(message)
        self.name = name
        self.requested = requested
        self.applied = applied
        self.device = device


def _value(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int (a whole number), not {type(value).__name__}") from None
    if v > _INT64_MAX:
        raise error(
            "CUDA_ERROR_INVALID_VALUE",
            f"{name} = {v:,} is not valid: it is larger than any device can hold",
            op="cudacore.limits",
            limit=name,
        )
    return v


class Limits:
    """The limits of one device's context: get and set them as attributes.

    >>> d.limits.malloc_heap_size = 256 << 20
    >>> d.limits.malloc_heap_size
    268435456

    Reading asks the driver. Setting validates the value (a bad one raises :class:`InvalidValueError` before
    the driver is called), sets it and reads it back: if the driver applied something else, a
    :class:`LimitClampedWarning` says so with both numbers, or, in strict mode (``limits.strict = True`` or
    ``with limits.strict_mode():``), an :class:`InvalidValueError` is raised and the previous value restored.

    ``malloc_heap_size`` can only change before the first kernel that uses device ``malloc`` runs in the
    process: set it at start-up.
    """

    __slots__ = ("_local", "_ordinal", "_strict")
    _local: threading.local
    _ordinal: int
    _strict: bool

    def __init__(self, ordinal: int) -> None:
        object.__setattr__(self, "_ordinal", ordinal)
        object.__setattr__(self, "_strict", False)
        object.__setattr__(self, "_local", threading.local())

    # -- strict mode ---------------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        """Whether a clamped set raises instead of warning (for this thread, inside :meth:`strict_mode`)."""
        override = getattr(self._local, "strict", None)
        return self._strict if override is None else override

    @strict.setter
    def strict(self, value: bool) -> None:
        object.__setattr__(self, "_strict", bool(value))

    @contextlib.contextmanager
    def strict_mode(self, strict: bool = True) -> Iterator[Limits]:
        """Within the block, on this thread, a clamped set raises (or, with ``strict=False``, warns)."""
        previous = getattr(self._local, "strict", None)
        self._local.strict = bool(strict)
        try:
            yield self
        finally:
            self._local.strict = previous

    # -- get and set ---------------------------------------------------------------------------------

    def get(self, name: str) -> int:
        """The current value of the limit called ``name``, as the driver reports it."""
        if not isinstance(name, str):
            raise TypeError(f"limit name must be a str, not {type(name).__name__}")
        return core.DeviceLimit(self._ordinal, name)

    def set(self, name: str, value: int, *, strict: bool | None = None) -> int:
        """Set a limit, read it back and return the value the driver applied.

        Raises
        ------
        InvalidValueError
            The name is unknown, the value is invalid (negative, absurd), the driver refused it, or, in strict
            mode, the driver clamped it.
        NotSupportedError
            The device does not have this limit.
        TypeError
            ``value`` is not an int.
        """
        return self._set(name, value, strict)

    def _set(self, name: str, value: Any, strict: bool | None, stacklevel: int = 3) -> int:
        if not isinstance(name, str):
            raise TypeError(f"limit name must be a str, not {type(name).__name__}")
        v = _value(name, value)
        is_strict = self.strict if strict is None else bool(strict)
        result = json.loads(core.DeviceSetLimit(self._ordinal, name, v, is_strict))
        if result["clamped"]:
            # The warning points at the caller's line: stacklevel counts this frame, set() or __setitem__
            # (3), or the property setter and __setattr__ (4).
            warnings.warn(
                LimitClampedWarning(
                    f"{result['message']} on device {self._ordinal}; the applied value is in effect "
                    "(set limits.strict = True to make this an error)",
                    name=name,
                    requested=result["requested"],
                    applied=result["applied"],
                    device=self._ordinal,
                ),
                stacklevel=stacklevel,
            )
        return result["applied"]

    def __getitem__(self, name: str) -> int:
        return self.get(name)

    def __setitem__(self, name: str, value: int) -> None:
        self._set(name, value, None)

    def as_dict(self) -> dict[str, int | None]:
        """Every limit's current value by name; ``None`` for a limit the device does not support."""
        data = json.loads(core.DeviceLimits(self._ordinal))
        values = data["values"]
        return {name: values.get(name) for name in LIMIT_NAMES}

    @contextlib.contextmanager
    def override(self, **values: int) -> Iterator[Limits]:
        """Set limits for the block and restore the previous values on exit, even on an exception.

        >>> with d.limits.override(stack_size=4096, printf_fifo_size=64 << 20):
        ...     k.launch(...)

        Unknown names raise before anything changes. Restoring ``malloc_heap_size`` fails if a kernel that
        uses device malloc ran inside the block (the heap is then fixed for the process); that error is raised
        on exit, or, if the block raised, added as a note to its exception.
        """
        unknown = [n for n in values if n not in LIMIT_NAMES]
        if unknown:
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"unknown limit {unknown[0]!r}: the limits are {', '.join(LIMIT_NAMES)}",
                op="cudacore.limits",
                limit=unknown[0],
            )
        checked = {n: _value(n, v) for n, v in values.items()}
        token = object()  # this block's entries in the overrides in force
        applied: list[str] = []
        try:
            with _OVERRIDES_LOCK:
                for name, value in checked.items():
                    key = (self._ordinal, name)
                    original = _OVERRIDES[key][0] if key in _OVERRIDES else self.get(name)
                    self._set(name, value, None)
                    _OVERRIDES.setdefault(key, (original, []))[1].append((token, value))
                    applied.append(name)
        except BaseException:
            self._restore(applied, token, None)
            raise
        failed: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            failed = exc
            raise
        finally:
            self._restore(applied, token, failed)

    def _restore(self, names: list[str], token: object, failed: BaseException | None) -> None:
        """End this block's overrides of names: each limit goes back to the newest override still in
        force (another thread's, or an enclosing block's), or to its value before the first of them.
        So overrides from several threads, ending in any order, leave the original value behind."""
        with _OVERRIDES_LOCK:
            restore = []
            for name in reversed(names):
                original, stack = _OVERRIDES[(self._ordinal, name)]
                stack[:] = [e for e in stack if e[0] is not token]
                if not stack:
                    del _OVERRIDES[(self._ordinal, name)]
                restore.append((name, stack[-1][1] if stack else original))
            self._apply(restore, failed)

    def _apply(self, restore: list[tuple[str, int]], failed: BaseException | None) -> None:
        first: CUDAError | None = None
        for name, old in restore:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", LimitClampedWarning)
                    core.DeviceSetLimit(self._ordinal, name, old, False)
            except CUDAError as exc:
                if failed is not None:
                    if hasattr(failed, "add_note"):  # Python 3.11+
                        failed.add_note(f"cudacore: restoring {name} to {old:,} failed: {exc}")
                elif first is None:
                    first = exc
        if first is not None:
            raise first

    # -- attribute access ----------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        # The limits and `strict` are properties with setters (so type checkers accept
        # `d.limits.stack_size = 4096`); any other name is refused with the list of limits.
        if name in LIMIT_NAMES or name == "strict":
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"Limits has no limit {name!r}: the limits are {', '.join(LIMIT_NAMES)}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(LIMIT_NAMES))

    def __repr__(self) -> str:
        try:
            values = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        except CUDAError as exc:
            values = f"<unavailable: {exc}>"
        return f"<cudacore.Limits of device {self._ordinal}: {values}>"

    # One property per limit: reading asks the driver, setting is set(name, value) (a value the device
    # does not support raises NotSupportedError either way; as_dict() shows it as None).
    @property
    def malloc_heap_size(self) -> int:
        """Bytes of the heap that device-side ``malloc``/``new`` allocate from (default 8 MiB).

        Fixed once a kernel that uses device malloc has run in the process: set it at start-up.
        """
        return self.get("malloc_heap_size")

    @malloc_heap_size.setter
    def malloc_heap_size(self, value: int) -> None:
        self._set("malloc_heap_size", value, None, 4)

    @property
    def stack_size(self) -> int:
        """Stack bytes of each GPU thread (default 1 KiB; at most 512 KiB)."""
        return self.get("stack_size")

    @stack_size.setter
    def stack_size(self, value: int) -> None:
        self._set("stack_size", value, None, 4)

    @property
    def printf_fifo_size(self) -> int:
        """Bytes of the FIFO that device-side ``printf`` writes to."""
        return self.get("printf_fifo_size")

    @printf_fifo_size.setter
    def printf_fifo_size(self, value: int) -> None:
        self._set("printf_fifo_size", value, None, 4)

    @property
    def dev_runtime_sync_depth(self) -> int:
        """Deepest grid nesting at which a device-runtime kernel may synchronize on its children (<= 24).

        Raises
        ------
        NotSupportedError
            On devices and drivers without it: CUDA 12 and later report it unsupported (the H100 under
            CUDA 13 does; ``as_dict()`` shows it as None).
        """
        return self.get("dev_runtime_sync_depth")

    @dev_runtime_sync_depth.setter
    def dev_runtime_sync_depth(self, value: int) -> None:
        self._set("dev_runtime_sync_depth", value, None, 4)

    @property
    def dev_runtime_pending_launch_count(self) -> int:
        """Device-runtime launches that may be outstanding at once."""
        return self.get("dev_runtime_pending_launch_count")

    @dev_runtime_pending_launch_count.setter
    def dev_runtime_pending_launch_count(self, value: int) -> None:
        self._set("dev_runtime_pending_launch_count", value, None, 4)

    @property
    def max_l2_fetch_granularity(self) -> int:
        """L2 fetch granularity hint in bytes: 0, 32, 64 or 128."""
        return self.get("max_l2_fetch_granularity")

    @max_l2_fetch_granularity.setter
    def max_l2_fetch_granularity(self, value: int) -> None:
        self._set("max_l2_fetch_granularity", value, None, 4)

    @property
    def persisting_l2_cache_size(self) -> int:
        """Bytes of L2 cache set aside for persisting accesses (compute capability 8.0 and later)."""
        return self.get("persisting_l2_cache_size")

    @persisting_l2_cache_size.setter
    def persisting_l2_cache_size(self, value: int) -> None:
        self._set("persisting_l2_cache_size", value, None, 4)


_cache: dict[int, Limits] = {}
_cache_lock = threading.Lock()


def limits_for(device: Device) -> Limits:
    """The one :class:`Limits` object of ``device`` (so that its strict setting sticks)."""
    ordinal = device.device_id
    lim = _cache.get(ordinal)
    if lim is None:
        with _cache_lock:
            lim = _cache.setdefault(ordinal, Limits(ordinal))
    return lim

"""Helpers for testing code that uses cudacore, on machines with or without a GPU.

Fault injection works on the simulator (``CUDACORE_BACKEND=sim``): it makes the Nth later call of a
driver entry point fail with a given CUresult, so tests can exercise out-of-memory and error paths that a
real GPU rarely shows. The pytest plugin (:mod:`cudacore.pytest_plugin`) wraps these in a marker and a
fixture.
"""

from __future__ import annotations

import json
from typing import Any

from ._api import core
from ._device import Device, _ordinal
from ._errors import error
from ._handles import current_ordinal

__all__ = ["clear_faults", "fail_allocations", "go_stacks_after", "inject_fault", "inject_faults", "set_memory_conditions"]


def _device_ordinal(device: Device | int | None, fn: str) -> int:
    """The ordinal ``device`` names: a :class:`Device`, an ordinal, or None for this thread's current
    device. A negative ordinal is an InvalidValueError naming ``fn``."""
    if device is None:
        return current_ordinal()
    if isinstance(device, Device):
        return device.device_id
    ordinal = _ordinal(device)
    if ordinal < 0:
        raise error("CUDA_ERROR_INVALID_VALUE", f"{fn}(): device must be >= 0, got {ordinal}", op=f"cudacore.testing.{fn}")
    return ordinal


def set_memory_conditions(device: Device | int | None, conditions: dict[str, Any]) -> int:
    """Model, on the simulator, what makes real allocations fail on ``device`` (replacing earlier
    conditions; ``{}`` clears them), so that each out-of-memory verdict can be tested without a GPU.

    Keys: ``other_processes``, a list of ``{"pid": int, "used": bytes}`` (their memory is not free, and
    the simulated NVML lists them); ``max_block``, the largest block one fresh allocation can get
    (fragmentation); ``pool_reservation_limit``, the most each memory pool may reserve (a refused
    reservation, as on vGPU, while cuMemAlloc still works); ``no_nvml``, true to model a machine without
    NVML (other processes are then estimated from the free memory); ``reuse_addresses``, true to hand
    released device addresses out again, lowest first whatever their size, and ``reuse_handles``, true to
    hand a destroyed stream's handle to the next stream created, as the real driver does both (so that a
    stale pointer or handle can name a new object; off, the simulator never reuses either, and a destroyed
    stream's handle ends the process as the driver's crash would). Returns the other processes' bytes.
    ``device`` is a :class:`Device` or an ordinal (None: the current device).

    Raises
    ------
    NotSupportedError
        When the process does not run on the simulator.
    InvalidValueError
        For an unknown key, a pid that is not positive, memory that does not fit, or an unknown device.
    """
    return int(core.SimSetMemoryConditions(_device_ordinal(device, "set_memory_conditions"), json.dumps(conditions)))


def inject_faults(spec: str) -> int:
    """Make later simulator driver calls fail: ``spec`` is ``"entry[@ordinal]:nth:code[,...]"`` as in
    ``CUDACORE_SIM_FAULTS`` (for example ``"cuMemAllocFromPoolAsync:3:CUDA_ERROR_OUT_OF_MEMORY"``: the third
    call from now fails), nth counted from now; with ``@ordinal`` only the calls made on that device count
    and fail (``"cuMemAlloc_v2@1:1:2"``). Returns how many faults were added.

    Raises
    ------
    NotSupportedError
        When the process does not run on the simulator.
    InvalidValueError
        For a malformed spec, an unknown entry point or a device the simulator does not have.
    """
    return core.SimInjectFaults(spec)


def inject_fault(
    entry: str, nth: int = 1, code: int | str = "CUDA_ERROR_OUT_OF_MEMORY", *, device: Device | int | None = None
) -> None:
    """Make the ``nth`` call from now of driver entry point ``entry`` fail with ``code`` (simulator).

    ``device`` (a :class:`Device` or an ordinal) counts and fails only the calls made on that device;
    None (the default) counts the calls on every device.
    """
    scope = "" if device is None else f"@{_device_ordinal(device, 'inject_fault')}"
    inject_faults(f"{entry}{scope}:{nth}:{code}")


def clear_faults() -> int:
    """Remove every pending simulator fault; returns how many were pending (injected, never reached)."""
    return core.SimClearFaults()


def fail_allocations(
    *, nth: int = 1, device: Device | int | None = None, code: int | str = "CUDA_ERROR_OUT_OF_MEMORY"
) -> None:
    """Make the ``nth`` allocation from now that reaches the driver on ``device`` fail (simulator).

    Keyword arguments only, the same as the pytest plugin's ``cudacore_faults.fail_allocations``.
    ``device`` is a :class:`Device` or an ordinal (None: the current device); allocations on other devices
    neither count nor fail. The fault is injected twice in a row, because cudacore's allocator retries a
    failed allocation once after releasing its cache; so :meth:`Device.allocate` raises
    :class:`cudacore.OutOfMemoryError` (for the default code), whose ``cause`` is ``"injected"``.
    Allocations served from cudacore's cache never reach the driver and are not counted: call
    ``release_cached_memory()`` on the device first for an exact count.
    """
    ordinal = _device_ordinal(device, "fail_allocations")
    strategy = Device(ordinal).allocation_strategy
    entry = "cuMemAllocFromPoolAsync" if strategy == "pool" else "cuMemAlloc_v2"
    inject_faults(f"{entry}@{ordinal}:{nth}:{code},{entry}@{ordinal}:{nth + 1}:{code}")


def go_stacks_after(seconds: float | None) -> None:
    """Write the stack of every goroutine to standard error after ``seconds``, unless called again first
    (``None`` or 0 disarms it; a new call replaces the old timer). Any backend.

    The Go half of a hang report: the timer fires on its own, whatever holds the GIL, and shows where
    cudacore's Go code and its calls into the driver wait. Pair it with
    ``faulthandler.dump_traceback_later`` for the Python half (tests/fuzz.py does).
    """
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        raise TypeError(f"go_stacks_after() takes a number of seconds or None, not {type(seconds).__name__}")
    if seconds is not None and not 0 <= seconds < 2**53 / 1000:
        raise ValueError(f"go_stacks_after(): seconds must be >= 0 and finite, got {seconds!r}")
    core.GoStacksAfter(int(seconds * 1000) if seconds else 0)

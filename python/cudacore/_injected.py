"""The ``injected`` out-of-memory verdict: an out-of-memory error that a fault injected into the simulator
caused (:mod:`cudacore.testing`, the pytest plugin's ``cudacore_faults``, ``CUDACORE_SIM_FAULTS``) says so.

Go's verdict reads the device as it is; after an injected failure the memory is there, so it would blame
the pool's reservation (or fragmentation) and advise on vGPU. On the simulator, each out-of-memory error
asks the simulator once whether the device's last allocation call was answered by an injected fault
(``SimTakeInjectedAllocationFailure``), and if so its cause becomes ``"injected"`` and its message says
what happened, with the verdict the device's state would have given in ``fields["cause_without_fault"]``.
"""

from __future__ import annotations

from . import _errors
from ._display import format_bytes

__all__ = ["INJECTED", "relabel"]

INJECTED = "injected"

#: The verdicts that the driver's answer decides; ``limit`` is reached before any driver call.
_DRIVER_VERDICTS = frozenset({"exhausted", "other_processes", "fragmentation", "pool_reservation", "too_large"})

_on_sim: bool | None = None


def _simulator() -> bool:
    global _on_sim
    if _on_sim is None:
        from ._api import core

        try:
            _on_sim = core.Backend() == "sim"
        except _errors.CUDAError:
            return False
    return _on_sim


def relabel(exc: _errors.CUDAError) -> None:
    """An :data:`cudacore._errors.HOOKS` hook: give an out-of-memory error that an injected fault caused
    the verdict ``"injected"`` and a message saying so. Does nothing off the simulator or for any other
    error."""
    if not isinstance(exc, _errors.OutOfMemoryError) or exc.cause not in _DRIVER_VERDICTS:
        return
    device = exc.device
    if device is None or not _simulator():
        return
    from ._api import core

    if not core.SimTakeInjectedAllocationFailure(device):
        return
    before = exc.fields.get("cause", "")
    exc.fields["cause_without_fault"] = before
    exc.fields["cause"] = INJECTED
    requested, free, total = format_bytes(exc.requested), format_bytes(exc.free), format_bytes(exc.total)
    message = (
        f"injected by cudacore.testing: out of memory allocating {requested} on device {device}, a fault "
        "injected into the simulator (cudacore.testing.fail_allocations or inject_fault(s), the pytest "
        f"plugin's cudacore_faults, or CUDACORE_SIM_FAULTS) answered the driver call {exc.op}. Nothing ran "
        f"short: {free} of {total} is free. ({exc.op}: {exc.name})"
    )
    exc.args = (message,)


# First, so that the other hooks (the flight record written to a file) see the verdict it gives.
_errors.HOOKS.insert(0, relabel)

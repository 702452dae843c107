"""The cold door into Go: gopy's generated functions, called through the C guard.

``core.Name(...)`` calls a facade function through its generated METH_FASTCALL wrapper (``fast.cold``):
the fork check and the argument checks run in C before Go is entered, and a Go error becomes its typed
exception through the one funnel (:func:`cudacore._errors.from_wire`, which raises it), in the wrapper
itself. The few entries whose parameters are not all scalars keep gopy's Python wrapper, which raises RuntimeError: call
those through :func:`call`, which translates. The hot entries are generated METH_FASTCALL functions of
``cudacore._fast`` itself and pass the same guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _errors
from ._native import core, fast

#: ``call(fn, *args)``: call any generated function through the guard and return its result; a Go error
#: raises its typed exception (in place of gopy's RuntimeError, not chained to it). It is the C function
#: itself, so it adds no Python frame; for a generated wrapper (most of ``core``) it only passes the call on.
call: Callable[..., Any] = fast.call


def forked() -> bool:
    """Whether this process is a fork child of one that had loaded cudacore (then no call enters Go)."""
    return bool(fast.forked())


def check_not_forked() -> None:
    """Raise :class:`IllegalStateError` if this process is a fork child of one that had loaded cudacore."""
    if fast.forked():
        raise _errors.forked_error("cudacore", fast.fork_driver())


__all__ = ["call", "check_not_forked", "core", "fast", "forked"]

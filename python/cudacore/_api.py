"""The cold door into Go: gopy's generated functions, called through the C guard.

Every call of a generated function goes through :func:`call`, which is ``cudacore._fast.call``: the fork
check runs in C before Go is entered, and a Go error becomes its typed exception through the one funnel
(:func:`cudacore._errors.from_wire`). The hot entries are generated METH_FASTCALL functions of
``cudacore._fast`` itself and pass the same guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _errors
from ._native import core, fast

#: ``call(fn, *args)``: call a generated function through the guard and return its result; a Go error
#: raises its typed exception (the RuntimeError from gopy is its ``__cause__``). It is the C function
#: itself, so a cold call adds no Python frame.
call: Callable[..., Any] = fast.call


def forked() -> bool:
    """Whether this process is a fork child of one that had loaded cudacore (then no call enters Go)."""
    return bool(fast.forked())


def check_not_forked() -> None:
    """Raise :class:`IllegalStateError` if this process is a fork child of one that had loaded cudacore."""
    if fast.forked():
        raise _errors.forked_error("cudacore", fast.fork_driver())


__all__ = ["call", "check_not_forked", "core", "fast", "forked"]

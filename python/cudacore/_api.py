"""The one door into the extension module: fork checks and error translation around every call."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from ._errors import IllegalStateError, from_runtime_error
from ._native import core

T = TypeVar("T")

_forked = False


def _mark_forked() -> None:
    global _forked
    _forked = True


# Neither the Go runtime nor CUDA survives fork(): a child that calls into the extension could hang on a
# lock held by a thread that no longer exists. So the child never enters Go; it gets a clear error instead.
os.register_at_fork(after_in_child=_mark_forked)

FORKED_MESSAGE = (
    "this process was forked from a parent that had loaded cudacore; CUDA and the Go runtime do not "
    "survive fork(). Start worker processes with the spawn method: "
    "multiprocessing.set_start_method('spawn') or multiprocessing.get_context('spawn'), or "
    "concurrent.futures.ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))."
)


def check_not_forked() -> None:
    """Raise if this process is a fork child of a process that had loaded cudacore."""
    if _forked:
        raise IllegalStateError(FORKED_MESSAGE, code=-2, name="CUDACORE_ERROR_FORKED", op="fork")


def call(fn: Callable[..., T], *args: Any) -> T:
    """Call a generated function; raise the typed exception for a wire-format error."""
    if _forked:
        check_not_forked()
    try:
        return fn(*args)
    except RuntimeError as exc:
        typed = from_runtime_error(exc)
        if typed is exc:
            raise
        raise typed from exc


__all__ = ["call", "check_not_forked", "core"]

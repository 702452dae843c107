"""The split by library of the memory a device's pool hands out (``memory_stats()["by_library"]``).

Go counts what cudacore's allocator holds in the pool (the ``"cudacore"`` row it sends) and the pool's
whole use (``pool_used``). The other rows are kept here, because the libraries they count live in
Python:

- libraries served *by cudacore's allocator* count their bytes here as they allocate and free (Numba's
  memory-manager plug-in): their bytes are part of Go's ``"cudacore"`` row and are moved out of it;
- libraries that allocate *from the same pool by themselves* (RMM through its statistics adaptor, or
  whatever a user names with ``SharedPool.track``) are asked for their bytes when the split is made;
- libraries that allocate from the pool and keep no count they publish (PyTorch's ``cudaMallocAsync``
  backend, CuPy's ``MemoryAsyncPool``, a ``SharedPool.track`` without a count) are *uncounted*: while
  exactly one of them draws from the pool, what the others leave is its row, named
  ``"<name> (by difference)"``, since nothing else that cudacore knows of allocates there.

What no library accounts for is ``"unattributed"``: the pool's use minus the named rows, never below 0
(0 while an uncounted library takes the remainder by difference).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = [
    "BY_DIFFERENCE",
    "RESERVED_NAMES",
    "count_inside",
    "inside_bytes",
    "report_outside",
    "report_uncounted",
    "reporters",
    "split",
    "uncounted",
]

#: Row names the split itself uses.
RESERVED_NAMES = frozenset({"cudacore", "unattributed"})

#: The end of the row name of a library whose bytes are the pool's remainder (``"torch (by difference)"``).
BY_DIFFERENCE = " (by difference)"

_lock = threading.Lock()
_inside: dict[int, dict[str, int]] = {}  # ordinal -> library -> bytes it holds through cudacore's allocator
_outside: dict[int, dict[str, Callable[[], int]]] = {}  # ordinal -> library -> its bytes in the pool, asked
_uncounted: dict[int, dict[str, Callable[[], bool]]] = {}  # ordinal -> library -> whether it draws from the pool now


def count_inside(ordinal: int, name: str, delta: int) -> None:
    """Add ``delta`` bytes (negative on a free) to what library ``name`` holds through cudacore's
    allocator on device ``ordinal``."""
    with _lock:
        rows = _inside.setdefault(ordinal, {})
        rows[name] = rows.get(name, 0) + delta


def inside_bytes(ordinal: int, name: str) -> int:
    """What library ``name`` holds through cudacore's allocator on device ``ordinal`` now."""
    with _lock:
        return _inside.get(ordinal, {}).get(name, 0)


def report_outside(ordinal: int, name: str, fn: Callable[[], int] | None) -> None:
    """Make ``fn()`` library ``name``'s row of device ``ordinal``'s split (None removes it)."""
    with _lock:
        rows = _outside.setdefault(ordinal, {})
        if fn is None:
            rows.pop(name, None)
        else:
            rows[name] = fn


def report_uncounted(ordinal: int, name: str, drawing: Callable[[], bool] | None) -> None:
    """Make library ``name`` an uncounted one of device ``ordinal``'s pool: ``drawing()`` says whether it
    allocates from the pool now (None removes it)."""
    with _lock:
        rows = _uncounted.setdefault(ordinal, {})
        if drawing is None:
            rows.pop(name, None)
        else:
            rows[name] = drawing


def reporters(ordinal: int) -> list[str]:
    """The libraries that report their own bytes on device ``ordinal``."""
    with _lock:
        return sorted(_outside.get(ordinal, {}))


def uncounted(ordinal: int) -> list[str]:
    """The uncounted libraries of device ``ordinal``'s pool, drawing from it now or not."""
    with _lock:
        return sorted(_uncounted.get(ordinal, {}))


def _drawing(fn: Callable[[], bool]) -> bool:
    try:
        return fn() is True
    except Exception:  # noqa: BLE001 - a library that cannot say is not taken to draw from the pool
        return False


def split(ordinal: int, used: int, held: dict[str, int], known: dict[str, int] | None = None) -> dict[str, int]:
    """The rows of ``by_library``: ``held`` (Go's rows) with the libraries served by cudacore's allocator
    moved out of ``"cudacore"``, each reporting library's bytes, the rows of ``known`` (counts a failure
    carried: PyTorch's own count in its out-of-memory message), the one uncounted library drawing from
    the pool, if only one does, with the remainder (``"<name> (by difference)"``), and ``"unattributed"``,
    what is left of ``used``. A reporter that raises or answers no int is left out (its bytes fall to
    the remainder)."""
    if "cudacore" not in held:  # no pool: the synchronous strategy
        return dict(held)
    with _lock:
        inside = {k: v for k, v in _inside.get(ordinal, {}).items() if v > 0}
        outside = list(_outside.get(ordinal, {}).items())
        candidates = list(_uncounted.get(ordinal, {}).items())
    rows = dict(held)
    rows["cudacore"] = max(rows["cudacore"] - sum(inside.values()), 0)
    rows.update(inside)
    for name, fn in outside:
        try:
            value = fn()
        except Exception:  # noqa: BLE001, S112 - a library's failing statistics leave its bytes unattributed
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            rows[name] = value
    rows.update(known or {})
    rest = max(used - sum(rows.values()), 0)
    drawing = [name for name, fn in candidates if name not in rows and _drawing(fn)]
    if len(drawing) == 1:
        rows[drawing[0] + BY_DIFFERENCE] = rest
        rest = 0
    rows["unattributed"] = rest
    return rows

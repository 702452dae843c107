"""The split by library of the memory a device's pool hands out (``memory_stats()["by_library"]``).

Go counts what cudacore's allocator holds in the pool (the ``"cudacore"`` row it sends) and the pool's
whole use (``pool_used``). The other rows are kept here, because the libraries they count live in
Python:

- libraries served *by cudacore's allocator* count their bytes here as they allocate and free (Numba's
  memory-manager plug-in): their bytes are part of Go's ``"cudacore"`` row and are moved out of it;
- libraries that allocate *from the same pool by themselves* (RMM through its statistics adaptor, or
  whatever a user names with ``SharedPool.track``) are asked for their bytes when the split is made.

What no library accounts for is ``"unattributed"``: the pool's use minus the named rows, never below 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["RESERVED_NAMES", "count_inside", "inside_bytes", "report_outside", "reporters", "split"]

#: Row names the split itself uses.
RESERVED_NAMES = frozenset({"cudacore", "unattributed"})

_lock = threading.Lock()
_inside: dict[int, dict[str, int]] = {}  # ordinal -> library -> bytes it holds through cudacore's allocator
_outside: dict[int, dict[str, Callable[[], int]]] = {}  # ordinal -> library -> its bytes in the pool, asked


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


def reporters(ordinal: int) -> list[str]:
    """The libraries that report their own bytes on device ``ordinal``."""
    with _lock:
        return sorted(_outside.get(ordinal, {}))


def split(ordinal: int, used: int, held: dict[str, int]) -> dict[str, int]:
    """The rows of ``by_library``: ``held`` (Go's rows) with the libraries served by cudacore's allocator
    moved out of ``"cudacore"``, each reporting library's bytes, and ``"unattributed"``, what is left of
    ``used``. A reporter that raises or answers no int is left out (its bytes fall to unattributed)."""
    if "cudacore" not in held:  # no pool: the synchronous strategy
        return dict(held)
    with _lock:
        inside = {k: v for k, v in _inside.get(ordinal, {}).items() if v > 0}
        outside = list(_outside.get(ordinal, {}).items())
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
    rows["unattributed"] = max(used - sum(rows.values()), 0)
    return rows

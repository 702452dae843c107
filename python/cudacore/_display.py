"""What the other layers show: byte counts for people, :class:`MemoryStats`, and the HTML reprs of devices
and buffers in notebooks.

Imports nothing of the package: the handles (``_memory``), the device (``_device``), ``cudacore doctor``
and the notebook tools (``_notebook``) all use it. The objects it renders are passed in; it only reads
their public attributes.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

if TYPE_CHECKING:
    from ._device import Device
    from ._memory import Buffer

__all__ = ["BYTE_KEYS", "MemoryStats", "MemoryStatsFields", "buffer_html", "device_html", "format_bytes", "new_memory_stats"]

#: The counters of :meth:`Device.memory_stats` that are byte counts.
BYTE_KEYS = {"in_use", "peak_in_use", "cached", "reserved", "limit", "pinned_in_use", "pinned_peak_in_use", "pinned_staging", "managed_in_use", "shared_in_use", "orphaned", "pool_used"}


def format_bytes(n: int | None) -> str:
    """``85017493504`` -> ``"79.2 GiB"``."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _fmt_exact(n: int) -> str:
    return format_bytes(n) if n < 1024 else f"{format_bytes(n)} ({n:,} B)"


def _table(rows: Iterable[tuple[str, Any]], title: str | None = None) -> str:
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
    return f"<table>{caption}{body}</table>"


class MemoryStatsFields(TypedDict):
    """The counters of :meth:`Device.memory_stats`, each key with its type (a type checker refuses a key
    that is not here). Byte counts are ints; ``limit`` is 0 when no limit is set."""

    in_use: int
    peak_in_use: int
    cached: int
    reserved: int
    allocations: int
    frees: int
    ooms: int
    failures: int
    recycled: int
    limit: int
    pinned_in_use: int
    pinned_peak_in_use: int
    pinned_staging: int
    orphaned: int
    managed_in_use: int
    managed_allocations: int
    shared_in_use: int
    shared_allocations: int
    strategy: Literal["pool", "sync"]
    live_tracked: int
    tracking: bool
    graph_destroy_failures: int
    graph_destroys_pending: int
    pool_used: int
    pool_shared: bool
    by_library: dict[str, int]


class _MemoryStatsDict(dict[str, Any]):
    """The dict :meth:`Device.memory_stats` returns, with an HTML table for notebooks (byte counts made
    readable). It compares equal to, and can be used as, a plain dict; its keys and their types are
    those of :class:`MemoryStatsFields`."""

    def _repr_html_(self) -> str:
        rows = []
        for k, v in self.items():
            if k in BYTE_KEYS and isinstance(v, int):
                shown = "no limit" if k == "limit" and v == 0 else _fmt_exact(v)
                rows.append((k, shown))
            elif k == "by_library" and isinstance(v, dict):
                rows.append((k, ", ".join(f"{name} {format_bytes(n)}" for name, n in v.items()) or "no pool"))
            else:
                rows.append((k, v))
        return _table(rows, "cudacore memory statistics")


if TYPE_CHECKING:
    # To a type checker MemoryStats is the TypedDict, so that ``stats["in_use"]`` is an int and
    # ``stats["no_such_key"]`` an error; at run time it is the dict subclass above, with its HTML table.
    class MemoryStats(MemoryStatsFields):
        """The dict :meth:`Device.memory_stats` returns (see :class:`MemoryStatsFields`)."""

else:
    MemoryStats = _MemoryStatsDict
    MemoryStats.__name__ = MemoryStats.__qualname__ = "MemoryStats"  # as users meet it (repr, pickle)


def new_memory_stats(counters: dict[str, Any]) -> MemoryStats:
    """A :class:`MemoryStats` of Go's counters (cudacore/memory.go's statsJSON, whose keys are
    :class:`MemoryStatsFields`'; a test checks that they agree)."""
    return cast("MemoryStats", _MemoryStatsDict(counters))


def device_html(dev: Device) -> str:
    major, minor = dev.compute_capability
    free, total = dev.memory_info()
    rows: list[tuple[str, Any]] = [
        ("ordinal", dev.device_id),
        ("name", dev.name),
        ("compute capability", f"{major}.{minor}"),
        ("multiprocessors", dev.multiprocessor_count),
        ("memory", f"{format_bytes(free)} free of {format_bytes(total)}"),
        ("allocator", f"{dev.allocation_strategy}: {dev.allocation_strategy_reason}"),
        ("memory pools", dev.memory_pools_supported),
        ("managed memory", dev.managed_memory),
        ("integrated", dev.integrated),
        ("uuid", dev.uuid),
        ("PCI bus id", dev.pci_bus_id),
    ]
    return _table(rows, f"cudacore.Device({dev.device_id})")


def buffer_html(buf: Buffer) -> str:
    kind = type(buf).__name__
    rows: list[tuple[str, Any]] = [("size", _fmt_exact(buf.size)), ("device", buf.device_id)]
    if buf.closed:
        rows.insert(0, ("state", "closed"))
    else:
        rows.insert(0, ("ptr", f"0x{buf.ptr:x}"))
        stream = buf.stream_handle
        rows.append(("stream", "legacy default" if stream in (0, 1) else f"0x{stream:x}"))
    if getattr(buf, "borrowed", False):
        rows.append(("owner", type(buf.owner).__name__ if buf.owner is not None else "released"))
    return _table(rows, f"cudacore.{kind}")

"""Notebook support: rich HTML reprs and a recorder of memory use over time."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._device import Device
    from ._memory import Buffer

__all__ = ["MemoryRecorder", "MemoryStats"]

_BYTE_KEYS = {"in_use", "peak_in_use", "cached", "reserved", "limit", "pinned_in_use", "pinned_peak_in_use"}


def _fmt_bytes(n: int) -> str:
    from ._doctor import format_bytes

    return format_bytes(n)


def _fmt_exact(n: int) -> str:
    return _fmt_bytes(n) if n < 1024 else f"{_fmt_bytes(n)} ({n:,} B)"


def _table(rows: Iterable[tuple[str, Any]], title: str | None = None) -> str:
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    caption = f"<caption style='text-align:left'><b>{html.escape(title)}</b></caption>" if title else ""
    return f"<table>{caption}{body}</table>"


class MemoryStats(dict[str, Any]):
    """The dict :meth:`Device.memory_stats` returns, with an HTML table for notebooks (byte counts made
    readable). It compares equal to, and can be used as, a plain dict."""

    def _repr_html_(self) -> str:
        rows = []
        for k, v in self.items():
            if k in _BYTE_KEYS and isinstance(v, int):
                shown = "no limit" if k == "limit" and v == 0 else _fmt_exact(v)
                rows.append((k, shown))
            else:
                rows.append((k, v))
        return _table(rows, "cudacore memory statistics")


def device_html(dev: Device) -> str:
    major, minor = dev.compute_capability
    free, total = dev.memory_info()
    rows: list[tuple[str, Any]] = [
        ("ordinal", dev.device_id),
        ("name", dev.name),
        ("compute capability", f"{major}.{minor}"),
        ("multiprocessors", dev.multiprocessor_count),
        ("memory", f"{_fmt_bytes(free)} free of {_fmt_bytes(total)}"),
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


class MemoryRecorder:
    """Records a device's memory statistics over time, for a table or a plot.

    >>> with cudacore.MemoryRecorder(interval_ms=10) as rec:   # samples in a background thread
    ...     run_my_workload()
    >>> rec                      # an HTML table in a notebook
    >>> rec.plot()               # with matplotlib installed

    Without ``interval_ms`` it samples only on :meth:`sample` (and on entering and leaving the ``with``
    block). Each sample is a dict: ``t`` (seconds since the start), ``label``, and the counters of
    :meth:`Device.memory_stats` (``in_use``, ``peak_in_use``, ``cached``, ``reserved``, ``allocations``,
    ``frees``, ``ooms``, ...).
    """

    def __init__(self, device: Device | int | None = None, interval_ms: float | None = None) -> None:
        from ._device import Device

        if device is None:
            device = 0
        self.device = device if isinstance(device, Device) else Device(device)
        if interval_ms is not None and interval_ms <= 0:
            raise ValueError(f"interval_ms must be positive, got {interval_ms}")
        self.interval_ms = interval_ms
        self.samples: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, label: str | None = None) -> dict[str, Any]:
        """Take one sample now (thread-safe) and return it."""
        stats = self.device.memory_stats()
        row: dict[str, Any] = {"t": round(time.perf_counter() - self._t0, 6), "label": label or ""}
        row.update(stats)
        with self._lock:
            self.samples.append(row)
        return row

    def start(self) -> MemoryRecorder:
        """Start sampling (in a background thread when ``interval_ms`` was given)."""
        self._t0 = time.perf_counter()
        self._stop.clear()
        self.sample("start")
        if self.interval_ms is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cudacore-memory-recorder", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread, if any, and take a last sample."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.sample("stop")

    def _run(self) -> None:
        assert self.interval_ms is not None
        while not self._stop.wait(self.interval_ms / 1000.0):
            self.sample()

    def __enter__(self) -> MemoryRecorder:  # noqa: PYI034 - Self needs 3.11
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def to_rows(self, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The samples as a list of dicts (all columns, or those named); ready for ``pandas.DataFrame``."""
        with self._lock:
            rows = list(self.samples)
        if columns is None:
            return [dict(r) for r in rows]
        return [{c: r.get(c) for c in columns} for r in rows]

    _COLUMNS = ("t", "label", "in_use", "peak_in_use", "cached", "reserved", "allocations", "frees", "ooms")

    def _repr_html_(self) -> str:
        rows = self.to_rows(self._COLUMNS)
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._COLUMNS)
        body = []
        for r in rows:
            cells = []
            for c in self._COLUMNS:
                v = r[c]
                cells.append(f"<td>{html.escape(_fmt_bytes(v) if c in _BYTE_KEYS and isinstance(v, int) else str(v))}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        caption = f"<caption style='text-align:left'><b>memory of device {self.device.device_id}, {len(rows)} samples</b></caption>"
        return f"<table>{caption}<tr>{head}</tr>{''.join(body)}</table>"

    def __repr__(self) -> str:
        return f"<cudacore.MemoryRecorder device {self.device.device_id}, {len(self.samples)} samples>"

    def plot(self, ax: Any = None, columns: Sequence[str] = ("in_use", "cached", "reserved")) -> Any:
        """Plot the byte counters against time with matplotlib (MiB); returns the Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("MemoryRecorder.plot needs matplotlib (pip install matplotlib); to_rows() gives the data") from exc
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3.5))
        rows = self.to_rows()
        ts = [r["t"] for r in rows]
        for c in columns:
            ax.step(ts, [r[c] / (1 << 20) for r in rows], where="post", label=c)
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        ax.set_title(f"cudacore memory, device {self.device.device_id}")
        ax.legend()
        return ax

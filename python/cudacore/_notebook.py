"""Notebook support: a recorder of memory use over time (the HTML reprs of devices, buffers and
statistics are in ``_display``, below the handles that use them)."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._device import Device
from ._display import BYTE_KEYS, MemoryStats, format_bytes

__all__ = ["MemoryRecorder", "MemoryStats"]


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
        if device is None:
            device = 0
        self.device = device if isinstance(device, Device) else Device(device)
        if interval_ms is not None:
            if isinstance(interval_ms, bool) or not isinstance(interval_ms, (int, float)):
                raise TypeError(f"MemoryRecorder: interval_ms must be a number of milliseconds, not {type(interval_ms).__name__}")
            # The background thread waits interval_ms at a time: the wait must accept it.
            if not 0 < interval_ms <= threading.TIMEOUT_MAX * 1000:
                raise ValueError(
                    f"MemoryRecorder: interval_ms must be positive and at most {threading.TIMEOUT_MAX * 1000:.0f}, "
                    f"got {interval_ms}"
                )
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
                cells.append(f"<td>{html.escape(format_bytes(v) if c in BYTE_KEYS and isinstance(v, int) else str(v))}</td>")
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

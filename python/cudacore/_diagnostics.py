"""Memory diagnostics: the flight recorder, memory_summary(), allocation logging and out-of-memory reports.

The flight recorder is a bounded ring of allocator events kept in Go (``pkg/memory/recorder.go``): every
allocation, free, out-of-memory failure, cache release and pool trim of every device, whichever door it
came through (:meth:`Device.allocate`, the CuPy, PyTorch and Numba allocators of :mod:`cudacore.interop`,
tiles). It is on by default; ``bench/recorder.py`` measures what it costs. Every
:class:`~cudacore.OutOfMemoryError` carries the events that led to it (``exc.flight_record``), and they are
written to a file when one is configured (``CUDACORE_FLIGHT_RECORD`` or :func:`configure_flight_recorder`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

from . import _accounts, _errors
from ._api import core, fast
from ._display import format_bytes
from ._errors import OutOfMemoryError
from ._handles import as_device

__all__ = [
    "configure_flight_recorder",
    "flight_record",
    "format_flight_record",
    "log_allocations",
    "memory_summary",
    "plot_flight_record",
]

#: The logger allocator events go to when :func:`log_allocations` is on.
logger = logging.getLogger("cudacore")

#: Events attached to each OutOfMemoryError: the newest this many before it.
OOM_EVENTS = 256

#: The package's directory: frames in it are left out of allocation stacks.
_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

_state: dict[str, Any] = {"path": os.environ.get("CUDACORE_FLIGHT_RECORD") or None, "stack_frames": 0}


def _unwritable(path: str) -> str | None:
    """Why out-of-memory reports cannot be appended to ``path`` (its folder is missing, or it is a
    folder), or None when they can be."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if os.path.isdir(path):
        return "it is a folder"
    return None


if _state["path"] is not None and (_why := _unwritable(_state["path"])) is not None:
    # Read at import, where raising would stop the import: say it now, not when the record is lost.
    warnings.warn(
        f"CUDACORE_FLIGHT_RECORD={_state['path']!r}: out-of-memory reports cannot be written there ({_why}); "
        "create the folder or point the variable at a file in one that exists",
        RuntimeWarning,
        stacklevel=2,
    )


def _ensure_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def configure_flight_recorder(
    *,
    enabled: bool | None = None,
    capacity: int | None = None,
    python_stacks: int | bool | None = None,
    path: str | os.PathLike[str] | None | bool = False,
) -> dict[str, Any]:
    """Configure the flight recorder; arguments left out keep their setting. Returns the settings.

    Parameters
    ----------
    enabled : bool, optional
        Record events (the default) or not. Events already kept stay.
    capacity : int, optional
        How many of the newest events the ring keeps, rounded up to a power of two (default 4096; at
        most 1,048,576).
    python_stacks : int or bool, optional
        Label each allocation made from Python with its innermost Python frames (``True``: 8 frames,
        ``False`` or 0: none, the default). It costs a few microseconds per allocation.
    path : str or os.PathLike or None, optional
        A file each out-of-memory failure's report (the message and its flight record, as text) is
        appended to; None stops writing. The ``CUDACORE_FLIGHT_RECORD`` variable sets it at import.

    Raises
    ------
    InvalidValueError
        For a capacity out of range, or a path whose folder does not exist (or that is a folder).
    """
    if enabled is not None or capacity is not None:
        cap = 0 if capacity is None else _ensure_int("capacity", capacity)
        if capacity is not None and cap <= 0:
            raise _errors.error("CUDA_ERROR_INVALID_VALUE", f"capacity must be positive, got {cap}", op="cudacore.flight_recorder")
        core.RecorderConfigure(-1 if enabled is None else int(bool(enabled)), cap)
    if python_stacks is not None:
        frames = 8 if python_stacks is True else 0 if python_stacks is False else _ensure_int("python_stacks", python_stacks)
        fast.set_stack_frames(frames, _PACKAGE_DIR)
        _state["stack_frames"] = frames
    if path is not False:
        new_path = None if path is None else os.fspath(path)  # type: ignore[arg-type]
        why = None if new_path is None else _unwritable(new_path)
        if why is not None:
            raise _errors.error(
                "CUDA_ERROR_INVALID_VALUE",
                f"configure_flight_recorder(): path {new_path!r} cannot take out-of-memory reports: {why}",
                op="cudacore.flight_recorder",
            )
        _state["path"] = new_path
    status = json.loads(core.RecorderEvents(0, 1))
    return {
        "enabled": status["enabled"],
        "capacity": status["capacity"],
        "python_stacks": _state["stack_frames"],
        "path": _state["path"],
    }


def track_python_stacks() -> None:
    """Turn Python stacks on (8 frames) unless they are on already: tracked live allocations then say
    which Python line made them."""
    if _state["stack_frames"] == 0:
        configure_flight_recorder(python_stacks=True)


def label_allocations(device_id: int, ptrs: list[int]) -> None:
    """Label the allocations ``ptrs`` of device ``device_id``, made just now by a call of cudacore's that
    does not pass the fast path's labelling (``allocate_tiles``), with the caller's Python stack, as the
    fast path labels those of ``Device.allocate``: the innermost frames outside cudacore's package, each
    ``file:line in function``. Does nothing unless Python stacks are on; best effort, as there."""
    frames = _state["stack_frames"]
    if frames <= 0 or not ptrs:
        return
    lines: list[str] = []
    f: FrameType | None = sys._getframe(1)
    while f is not None and len(lines) < frames:
        code = f.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            lines.append(f"{code.co_filename}:{f.f_lineno} in {code.co_name}")
        f = f.f_back
    label = "\n".join(lines)
    for p in ptrs:
        with contextlib.suppress(_errors.CUDAError):
            core.MemoryLabel(device_id, p, label)


def flight_record(limit: int | None = None, *, device: int | None = None, after: int = 0) -> list[dict[str, Any]]:
    """The flight recorder's events, oldest first: each a dict with ``seq``, ``t_ns`` (nanoseconds since
    the recorder started), ``kind`` (``"alloc"``, ``"free"``, ``"oom"``, ``"release"`` or ``"trim"``),
    ``device``, ``ptr``, ``size``, ``stream``, ``in_use`` (the allocator's bytes in use after it) and
    ``note`` (the verdict for ``oom``, the Python stack for ``alloc`` when asked for, the reason for
    ``release``).

    Parameters
    ----------
    limit : int, optional
        At most this many of the newest events (0: none); None, every event the recorder keeps.
    device : int, optional
        Only this device's events.
    after : int
        Only events with a ``seq`` above this.
    """
    n = 0 if limit is None else _ensure_int("limit", limit)
    if n < 0:
        raise _errors.error(
            "CUDA_ERROR_INVALID_VALUE",
            f"flight_record(): limit must be >= 0 (None: every event kept), got {n}",
            op="cudacore.flight_record",
        )
    if limit == 0:
        return []
    events: list[dict[str, Any]] = json.loads(core.RecorderEvents(_ensure_int("after", after), n))["events"]
    if device is not None:
        events = [e for e in events if e["device"] == device]
    return events


def _event_line(e: dict[str, Any], t0: int) -> str:
    t = (e["t_ns"] - t0) / 1e6
    kind = e["kind"]
    head = f"{t:+11.3f} ms  #{e['seq']:<7d} {kind:<7s} dev {e['device']}"
    if kind in ("alloc", "free"):
        body = f"{format_bytes(e['size']):>10s} at 0x{e['ptr']:x} stream {e['stream']}"
    elif kind == "oom":
        body = f"{format_bytes(e['size']):>10s} requested, cause {e.get('note') or '?'}"
    else:
        body = f"{format_bytes(e['size']):>10s} {'returned to the device' if kind == 'trim' else 'released'}"
    line = f"{head}  {body}  (in use {format_bytes(e['in_use'])})"
    note = e.get("note")
    if kind == "alloc" and note:
        line += "\n" + "\n".join("        " + s for s in note.splitlines())
    return line


def format_flight_record(events: list[dict[str, Any]] | None = None, *, limit: int = 50) -> str:
    """The events (default: the newest ``limit`` of the recorder) as text, one line each, times relative
    to the last one."""
    if events is None:
        events = flight_record(limit)
    if not events:
        return "flight recorder: no events"
    t0 = events[-1]["t_ns"]
    lines = [f"flight recorder: {len(events)} events (times relative to the last)"]
    lines += [_event_line(e, t0) for e in events]
    return "\n".join(lines)


def plot_flight_record(events: list[dict[str, Any]] | None = None, *, ax: Any = None, device: int | None = None) -> Any:
    """A timeline of the events (default: all the recorder keeps): bytes in use over time per device, with
    out-of-memory failures marked. Needs matplotlib; returns the Axes."""
    if ax is None:
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("plot_flight_record needs matplotlib (pip install matplotlib)") from exc
        _, ax = plt.subplots(figsize=(8, 3))
    if events is None:
        events = flight_record(device=device)
    if not events:
        ax.set_title("flight recorder: no events")
        return ax
    t0 = events[0]["t_ns"]
    for dev in sorted({e["device"] for e in events}):
        evs = [e for e in events if e["device"] == dev]
        xs = [(e["t_ns"] - t0) / 1e6 for e in evs]
        ax.step(xs, [e["in_use"] / 2**20 for e in evs], where="post", label=f"device {dev} in use")
        ooms = [e for e in evs if e["kind"] == "oom"]
        if ooms:
            ax.scatter([(e["t_ns"] - t0) / 1e6 for e in ooms], [e["in_use"] / 2**20 for e in ooms], marker="x", color="red",
                       zorder=3, label=f"device {dev} out of memory")
        rel = [e for e in evs if e["kind"] in ("release", "trim")]
        for e in rel:
            ax.axvline((e["t_ns"] - t0) / 1e6, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("in use (MiB)")
    ax.set_title("cudacore flight recorder")
    ax.legend(loc="best", fontsize="small")
    return ax


def _attach(exc: _errors.CUDAError) -> None:
    """The OutOfMemoryError hook: attach the events up to this failure, write them if configured."""
    if not isinstance(exc, OutOfMemoryError) or exc.op == "fork":
        return
    upto = exc._int_field("event")
    events = flight_record(OOM_EVENTS if upto is None else None, after=0 if upto is None else max(0, upto - OOM_EVENTS))
    if upto is not None:
        events = [e for e in events if e["seq"] <= upto]
    exc.flight_record = events
    path = _state["path"]
    if path:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"=== cudacore out of memory, {stamp}, pid {os.getpid()}\n{exc}\n{format_flight_record(events)}\n\n")
        except OSError as e:  # the error it describes stands; the lost record is said, not swallowed
            warnings.warn(f"cudacore could not write the out-of-memory report to {path!r}: {e}", RuntimeWarning, stacklevel=2)


_errors.HOOKS.append(_attach)


# -- memory_summary ------------------------------------------------------------------------------------


def memory_summary(device: Any = None, *, events: int = 10, largest: int = 10) -> str:
    """A readable report of a device's memory: the allocator's counters, the device's free memory, the
    largest live allocations (with tracking, see :meth:`Device.set_allocation_strategy`) and the newest
    flight-recorder events.

    Parameters
    ----------
    device : Device or int, optional
        The device (default 0).
    events : int
        How many of the newest events to show.
    largest : int
        How many of the largest live allocations to show.
    """
    dev = as_device(device)
    stats = dev.memory_stats()
    free, total = dev.memory_info()
    s: dict[str, Any] = dict(stats)
    w = 26
    rows = [
        ("in use", format_bytes(s["in_use"])),
        ("peak in use", format_bytes(s["peak_in_use"])),
        ("cached (cache + pool)", format_bytes(s["cached"])),
        ("reserved by the pool", format_bytes(s["reserved"])),
        ("limit", format_bytes(s["limit"]) if s["limit"] else "none"),
        ("allocations / frees", f"{s['allocations']} / {s['frees']}"),
        ("out of memory / failures", f"{s['ooms']} / {s['failures']}"),
        ("pinned in use (peak)", f"{format_bytes(s['pinned_in_use'])} ({format_bytes(s['pinned_peak_in_use'])})"),
        ("device free / total", f"{format_bytes(free)} / {format_bytes(total)}"),
        ("strategy", s["strategy"]),
    ]
    title = f"cudacore memory summary: device {dev.device_id} ({dev.name})"
    bar = "=" * max(len(title), 60)
    out = [bar, title, bar]
    out += [f"{k:<{w}s} {v}" for k, v in rows]
    if s["by_library"]:
        shared = "shared with the process's libraries (share_pool)" if s["pool_shared"] else "not shared (share_pool shares it)"
        out.append("-" * len(bar))
        out.append(f"the pool: {format_bytes(s['pool_used'])} used of {format_bytes(s['reserved'])} reserved, {shared}")
        out.append("used, by library:")
        out += [f"  {name:<{w - 2}s} {format_bytes(n)}" for name, n in s["by_library"].items()]
        if any(name.endswith(_accounts.BY_DIFFERENCE) for name in s["by_library"]):
            out.append("  (by difference: the pool's use less every count, the row of the one library drawing from")
            out.append("   the pool without a count of its own)")
        if s["by_library"].get("unattributed"):
            out.append("  (unattributed: what no count covers: the libraries without a count of their own, such as")
            out.append("   PyTorch's cudaMallocAsync backend and CuPy's MemoryAsyncPool, while two or more draw from")
            out.append("   the pool, and anything else drawing from it)")
    live = dev.live_allocations()
    if s["tracking"]:
        out.append("-" * len(bar))
        out.append(f"live allocations: {len(live)} (largest {min(largest, len(live))})")
        for a in sorted(live, key=lambda a: -a["size"])[:largest]:
            where = (a.get("where") or "").splitlines()
            out.append(f"  {format_bytes(a['size']):>10s} at 0x{a['ptr']:x}  {where[0] if where else '(no stack)'}")
    else:
        out.append("-" * len(bar))
        out.append("live allocations: not tracked (set_allocation_strategy(track=True) lists them)")
    evs = flight_record(events, device=dev.device_id) if events > 0 else []
    out.append("-" * len(bar))
    out.append(format_flight_record(evs) if evs else "flight recorder: no events for this device")
    out.append(bar)
    return "\n".join(out)


# -- logging ----------------------------------------------------------------------------------------------

_log_lock = threading.Lock()
_log: dict[str, Any] = {"thread": None, "stop": None, "after": 0}


def _emit(events: list[dict[str, Any]], level: int) -> None:
    for e in events:
        lvl = logging.WARNING if e["kind"] == "oom" else level
        if not logger.isEnabledFor(lvl):
            continue
        t0 = e["t_ns"]
        logger.log(lvl, "%s", _event_line(e, t0).split("  ", 1)[1].strip(), extra={"cudacore_event": e})


def log_allocations(enabled: bool = True, *, level: int = logging.DEBUG, interval: float = 0.05) -> None:
    """Log allocator events to the ``"cudacore"`` logger (opt-in; off by default).

    A background thread reads the flight recorder every ``interval`` seconds and logs each new event at
    ``level`` (an out-of-memory failure at WARNING); each record carries the event as
    ``record.cudacore_event``. Turning it off logs what is left. Events the ring overwrote between two
    reads (more than its capacity within ``interval``) are reported as lost.
    """
    with _log_lock:
        thread, stop = _log["thread"], _log["stop"]
        if thread is not None:
            stop.set()
            thread.join()
            _log["thread"] = None
            _drain(level)
        if not enabled:
            return
        _log["after"] = json.loads(core.RecorderEvents(0, 1))["last"]
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                _drain(level)

        thread = threading.Thread(target=run, name="cudacore-alloc-log", daemon=True)
        _log["thread"], _log["stop"] = thread, stop
        thread.start()


def _drain(level: int) -> None:
    after = _log["after"]
    events = flight_record(after=after)
    if events and events[0]["seq"] > after + 1:
        logger.warning("%d allocator events were lost (the flight recorder's ring wrapped)", events[0]["seq"] - after - 1)
    if events:
        _log["after"] = events[-1]["seq"]
        _emit(events, level)

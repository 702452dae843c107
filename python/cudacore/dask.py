"""cudacore on a Dask cluster: a worker plugin, one report of every worker's memory, and Buffers sent
between workers.

Needs ``dask`` and ``distributed`` (``pip install "cudacore[dask]"``); importing cudacore itself never
imports them.

- :class:`CudacorePlugin`, registered with ``client.register_plugin(CudacorePlugin())``, makes cudacore
  the allocator of CuPy on every worker (one worker per GPU, as ``LocalCUDACluster`` and
  ``dask-cuda-worker`` run them), and puts the previous allocator back when the worker closes or the
  plugin is removed.
- :func:`memory_report` brings every worker's :meth:`~cudacore.Device.memory_stats`, out-of-memory
  verdicts and flight record back to the client in one call, as text and as a notebook table.
- Importing this module registers Dask's serializers for :class:`cudacore.Buffer`: the ``"cuda"`` family
  hands the Buffer's device memory to a transport that moves device memory (UCX), with no host copy; the
  ``"dask"`` family copies it to host memory for TCP. Either way it arrives as a Buffer of cudacore's on
  the receiving worker's device. ``dask.sizeof`` counts a Buffer as its size. The plugin imports this
  module on every worker, which is what registers all of them there.

An :class:`~cudacore.OutOfMemoryError` raised by a task reaches the client as itself (it pickles with its
verdict, its fields and its flight record); docs/guide/multi-gpu.md has the whole story.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import os
import socket
import threading
import traceback
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    from dask.sizeof import sizeof
    from distributed import WorkerPlugin
    from distributed.protocol import dask_deserialize, dask_serialize
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.worker import thread_state
except ImportError as exc:  # pragma: no cover - exercised only where distributed is missing
    raise ImportError(f"cudacore.dask needs dask and distributed ({exc}): pip install 'cudacore[dask]'") from exc

from . import _errors, interop
from ._device import Device, backend, is_available, unavailable_reason
from ._diagnostics import flight_record, format_flight_record
from ._display import MemoryStats, format_bytes, new_memory_stats
from ._errors import CUDAError, OutOfMemoryError, error
from ._memory import Buffer
from ._stream import Event

__all__ = ["PLUGIN_NAME", "CudacorePlugin", "MemoryReport", "WorkerMemory", "memory_report"]

#: The name the plugin is registered under on every worker (``worker.plugins[PLUGIN_NAME]``).
PLUGIN_NAME = "cudacore"


# -- the plugin -------------------------------------------------------------------------------------------


@dataclass
class _Installation:
    """What the plugin changed in this process, and who relies on it. CuPy's allocator is one per process,
    so workers sharing a process (``LocalCluster(processes=False)``) share one installation: the first
    worker's setup makes it, the last one's teardown undoes it."""

    device: int
    workers: set[str]
    libraries: dict[str, str]
    cupy_previous: Any = None  # CuPy's allocator before ours
    cupy_ours: Any = None  # the allocator we set (None: CuPy left alone)


_lock = threading.RLock()
_installed: _Installation | None = None
#: task key -> weak references to the OutOfMemoryErrors made while it ran (see CudacorePlugin.transition)
_task_ooms: dict[Any, list[weakref.ref[BaseException]]] = {}


def _note_task_oom(exc: CUDAError) -> None:
    """The error hook the plugin installs: remember an OutOfMemoryError made inside a task, by its key."""
    if not isinstance(exc, OutOfMemoryError):
        return
    key = getattr(thread_state, "key", None)
    if key is None:
        return
    with _lock:
        _task_ooms.setdefault(key, []).append(weakref.ref(exc))


def _rmm_status() -> str:
    if importlib.util.find_spec("rmm") is None:
        return "not installed"
    # RMM's memory resource stays its own: cudacore has no RMM resource of its own yet.
    return "left as it is: cudacore does not provide an RMM memory resource yet"


def _install(device: int, cupy: bool) -> _Installation:
    libraries: dict[str, str] = {}
    previous = ours = None
    if not cupy:
        libraries["cupy"] = "left as it is (CudacorePlugin(cupy=False))"
    elif importlib.util.find_spec("cupy") is None:
        libraries["cupy"] = "not installed"
    else:
        import cupy as cp

        previous = cp.cuda.get_allocator()
        ours = interop.cupy_allocator(device)
        cp.cuda.set_allocator(ours)
        libraries["cupy"] = f"installed: CuPy allocates from cudacore on device {device}"
    libraries["rmm"] = _rmm_status()
    _errors.HOOKS.append(_note_task_oom)
    return _Installation(device, set(), libraries, previous, ours)


def _uninstall(inst: _Installation) -> None:
    with contextlib.suppress(ValueError):
        _errors.HOOKS.remove(_note_task_oom)
    _task_ooms.clear()
    if inst.cupy_ours is None:
        return
    import cupy as cp

    # Put the previous allocator back only while ours is still the one in place: an allocator someone set
    # after ours is theirs to keep.
    if cp.cuda.get_allocator() is inst.cupy_ours:
        cp.cuda.set_allocator(inst.cupy_previous)


class CudacorePlugin(WorkerPlugin):
    """Installs cudacore on every worker of a Dask cluster.

    Register it once from the client, ``client.register_plugin(CudacorePlugin())`` (distributed's
    ``Client.register_plugin``); every worker, those that join later included, runs :meth:`setup`.

    On each worker it makes cudacore the allocator of CuPy on the worker's GPU
    (``cupy.cuda.set_allocator(cudacore.interop.cupy_allocator(device))``), so CuPy's memory shows in
    ``memory_stats()``, counts against ``memory_limit`` and runs out with an
    :class:`~cudacore.OutOfMemoryError` carrying its verdict. A library that is not installed on the
    worker is skipped and said so in :attr:`libraries`. RMM is left as it is: cudacore does not provide an
    RMM memory resource yet.

    Parameters
    ----------
    device : int, optional
        The worker's GPU as a cudacore ordinal. Default 0: the first device the worker sees, which is its
        GPU under ``LocalCUDACluster`` and ``dask-cuda-worker`` (each worker sees one GPU first in its
        ``CUDA_VISIBLE_DEVICES``). CuPy must use the same device on the worker.
    cupy : bool
        Make cudacore CuPy's allocator (default True).

    Attributes
    ----------
    libraries : dict[str, str]
        After :meth:`setup` on a worker: each library and what the plugin did with it there
        (``"installed: ..."``, ``"not installed"``, ``"left as it is: ..."``).
    device : int
        The worker's device ordinal.

    Notes
    -----
    CuPy has one allocator per process, so workers that share a process (``LocalCluster(processes=False)``)
    share one installation: it is made by the first worker's setup and undone by the last one's teardown,
    and all of them must name the same device (another is refused with ``InvalidValueError``). Teardown
    puts back the allocator CuPy had before, unless something replaced cudacore's since.
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, device: int | None = None, *, cupy: bool = True) -> None:
        if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise TypeError(f"CudacorePlugin: device must be a device ordinal (an int >= 0) or None, not {device!r}")
        self.device = 0 if device is None else device
        self.cupy = bool(cupy)
        self._key: str | None = None

    @property
    def libraries(self) -> dict[str, str]:
        """Each library and what the plugin did with it in this worker's process (empty before
        :meth:`setup` and after :meth:`teardown`)."""
        inst = _installed
        if inst is None or self._key not in inst.workers:
            return {}
        return dict(inst.libraries)

    def setup(self, worker: Any) -> None:
        """Install cudacore in the worker's process (once per process), checking the worker's device.

        Raises
        ------
        InvalidValueError
            The device does not exist on the worker, or another worker of this process installed cudacore
            for another device.
        DriverNotFoundError
            The worker has no CUDA driver (and does not run the simulator).
        """
        Device(self.device)  # the worker's device exists: a typed error here fails the registration
        key = str(getattr(worker, "id", None) or id(worker))
        global _installed
        with _lock:
            inst = _installed
            if inst is None:
                inst = _installed = _install(self.device, self.cupy)
            elif inst.device != self.device:
                raise error(
                    "CUDA_ERROR_INVALID_VALUE",
                    f"CudacorePlugin: this process's cudacore serves device {inst.device} for its other workers, "
                    f"and CuPy has one allocator per process: a worker of the same process cannot use device "
                    f"{self.device} (run one worker per process, as dask-cuda does)",
                    op="cudacore.dask.setup",
                )
            inst.workers.add(key)
            self._key = key

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """When a task that ran out of memory has failed, let go of the memory its frames held.

        distributed keeps the exception in a frame of its traceback while it reports the failure: a
        reference cycle that holds every frame of the task, and so its Buffers and CuPy arrays, until
        Python's garbage collector next runs, and the worker would go on short of that memory. The plugin
        notes each :class:`~cudacore.OutOfMemoryError` made while a task runs (a weak reference, by task),
        and when that task leaves execution in error, clears the local variables of the finished frames of
        their tracebacks (``traceback.clear_frames``): what the task held is freed at once. The client's
        copy of the error is not touched (it crossed as a pickle), nor are errors of tasks that succeeded.
        """
        if start not in ("executing", "long-running"):
            return
        with _lock:
            refs = _task_ooms.pop(key, [])
        if finish != "error":
            return
        for ref in refs:
            exc = ref()
            if exc is not None:
                traceback.clear_frames(exc.__traceback__)

    def teardown(self, worker: Any) -> None:
        """Forget this worker; the last worker of the process puts back what :meth:`setup` changed."""
        global _installed
        with _lock:
            inst, key = _installed, self._key
            if inst is None or key is None or key not in inst.workers:
                return
            inst.workers.discard(key)
            self._key = None
            if inst.workers:
                return
            _installed = None
            _uninstall(inst)


# -- memory_report ----------------------------------------------------------------------------------------


@dataclass
class WorkerMemory:
    """One worker's part of a :class:`MemoryReport`.

    Attributes
    ----------
    address : str
        The worker's address.
    host : str
        The worker's host name.
    pid : int
        The worker's process id.
    device : int
        The cudacore ordinal reported (the plugin's device, or 0 without the plugin).
    name, uuid : str
        The device's name and UUID ("" when the worker has no device).
    visible_devices : str or None
        The worker's ``CUDA_VISIBLE_DEVICES``.
    backend : str
        ``"cuda"`` or ``"sim"``.
    stats : MemoryStats or None
        The device's :meth:`~cudacore.Device.memory_stats` (None when the worker has no device).
    free, total : int
        The device's free and total memory in bytes.
    ooms : list of dict
        The out-of-memory events the worker's flight recorder still holds for the device, oldest first;
        each event's ``note`` is its verdict (``"exhausted"``, ``"limit"``, ...).
    events : list of dict
        The newest flight-recorder events of the device.
    libraries : dict[str, str] or None
        What the plugin did on the worker (None: no :class:`CudacorePlugin` there).
    error : str or None
        Why the worker could not report its device (no driver, no such device); the rest is then empty.
    """

    address: str
    host: str
    pid: int
    device: int
    name: str = ""
    uuid: str = ""
    visible_devices: str | None = None
    backend: str = ""
    stats: MemoryStats | None = None
    free: int = 0
    total: int = 0
    ooms: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    libraries: dict[str, str] | None = None
    error: str | None = None

    def __str__(self) -> str:
        head = f"worker {self.address} (host {self.host}, pid {self.pid})"
        if self.error is not None or self.stats is None:
            return f"{head}\n  no device: {self.error}"
        s = self.stats
        lines = [
            head,
            f"  device {self.device}: {self.name} ({self.backend}), CUDA_VISIBLE_DEVICES={self.visible_devices}",
            (
                f"  in use {format_bytes(s['in_use'])} (peak {format_bytes(s['peak_in_use'])}), "
                f"cached {format_bytes(s['cached'])}, limit {format_bytes(s['limit']) if s['limit'] else 'none'}"
            ),
            (
                f"  device free {format_bytes(self.free)} of {format_bytes(self.total)}; "
                f"allocations {s['allocations']}, frees {s['frees']}, out of memory {s['ooms']}"
            ),
        ]
        if self.libraries is None:
            lines.append("  plugin: not registered on this worker")
        else:
            lines += [f"  {lib}: {what}" for lib, what in self.libraries.items()]
        if self.ooms:
            lines.append(f"  out-of-memory verdicts ({len(self.ooms)} kept by the flight recorder):")
            lines += [
                f"    #{e['seq']} {format_bytes(e['size'])} requested: {e.get('note') or '?'} (in use {format_bytes(e['in_use'])})"
                for e in self.ooms
            ]
        if self.events:
            lines += ["  " + line for line in format_flight_record(self.events).splitlines()]
        return "\n".join(lines)


def _worker_report(dask_worker: Any = None, events: int = 20) -> dict[str, Any]:
    """Run on each worker by :func:`memory_report` (``client.run`` passes the worker): its report as
    plain data."""
    plugin = None if dask_worker is None else getattr(dask_worker, "plugins", {}).get(PLUGIN_NAME)
    ordinal = plugin.device if plugin is not None else 0
    out: dict[str, Any] = {
        "address": str(getattr(dask_worker, "address", "")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": ordinal,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "libraries": None if plugin is None else dict(plugin.libraries),
    }
    if not is_available():
        out["error"] = unavailable_reason()
        return out
    try:
        dev = Device(ordinal)
        stats = dev.memory_stats()
        free, total = dev.memory_info()
    except Exception as exc:  # noqa: BLE001 - the report says what went wrong on that worker
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    kept = flight_record(device=ordinal)
    out.update(
        name=dev.name,
        uuid=dev.uuid,
        backend=backend(),
        stats=dict(stats),
        free=free,
        total=total,
        ooms=[e for e in kept if e["kind"] == "oom"],
        events=kept[-events:] if events > 0 else [],
    )
    return out


class MemoryReport(Mapping[str, WorkerMemory]):
    """Every worker's memory, gathered by :func:`memory_report`: a mapping of worker address to
    :class:`WorkerMemory`, printed as text (``str(report)``) and shown as a table in a notebook.

    Workers that share a process (``LocalCluster(processes=False)``) share its cudacore, so they report
    the same device and the same counters.
    """

    def __init__(self, workers: Mapping[str, WorkerMemory]) -> None:
        self.workers: dict[str, WorkerMemory] = dict(sorted(workers.items()))

    def __getitem__(self, address: str) -> WorkerMemory:
        return self.workers[address]

    def __iter__(self) -> Iterator[str]:
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def __str__(self) -> str:
        title = f"cudacore memory report: {len(self.workers)} workers"
        bar = "=" * 72
        parts = [bar, title, bar]
        for w in self.workers.values():
            parts += [str(w), "-" * 72]
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"<cudacore.dask.MemoryReport {len(self.workers)} workers>"

    _COLUMNS = ("worker", "device", "in use", "peak", "cached", "device free / total", "allocations", "out of memory", "verdicts", "plugin")

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._COLUMNS)
        rows = []
        for w in self.workers.values():
            if w.stats is None:
                cells = [w.address, f"none: {w.error}"] + [""] * (len(self._COLUMNS) - 2)
            else:
                s = w.stats
                verdicts = ", ".join(f"{format_bytes(e['size'])}: {e.get('note') or '?'}" for e in w.ooms)
                plugin = "not registered" if w.libraries is None else "; ".join(f"{k}: {v}" for k, v in w.libraries.items())
                cells = [
                    w.address,
                    f"{w.device}: {w.name}",
                    format_bytes(s["in_use"]),
                    format_bytes(s["peak_in_use"]),
                    format_bytes(s["cached"]),
                    f"{format_bytes(w.free)} / {format_bytes(w.total)}",
                    str(s["allocations"]),
                    str(s["ooms"]),
                    verdicts,
                    plugin,
                ]
            rows.append("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        caption = f"<caption style='text-align:left'><b>cudacore memory report: {len(self.workers)} workers</b></caption>"
        return f"<table>{caption}<tr>{head}</tr>{''.join(rows)}</table>"


def memory_report(client: Any, *, events: int = 20, workers: list[str] | None = None) -> MemoryReport:
    """Every worker's memory in one call (``client.run``): its device's ``memory_stats()``, free and
    total memory, the out-of-memory verdicts its flight recorder holds, its newest flight-recorder events
    and what :class:`CudacorePlugin` did there.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    events : int
        How many of each worker's newest flight-recorder events to bring back (0: none).
    workers : list of str, optional
        Only these workers (addresses); default every worker.

    Returns
    -------
    MemoryReport
        A mapping of worker address to :class:`WorkerMemory`; ``str()`` is a text report, and a notebook
        shows a table.
    """
    if isinstance(events, bool) or not isinstance(events, int) or events < 0:
        raise TypeError(f"memory_report: events must be an int >= 0, not {events!r}")
    raw: dict[str, dict[str, Any]] = client.run(_worker_report, events=events, workers=workers)
    report = {}
    for address, r in raw.items():
        stats = r.pop("stats", None)
        r["address"] = address
        report[address] = WorkerMemory(stats=None if stats is None else new_memory_stats(stats), **r)
    return MemoryReport(report)


# -- serialization -----------------------------------------------------------------------------------------


def _check_open(buf: Buffer, op: str) -> None:
    if buf.closed:
        raise error(
            "CUDACORE_ERROR_CLOSED",
            f"a closed cudacore Buffer ({buf.size} bytes, device {buf.device_id}) cannot be sent to another worker: "
            "its memory was freed",
            op=op,
        )


def _settle(buf: Buffer) -> None:
    """Wait until the work queued on the buffer's stream is done, so that a transport (which orders
    nothing on that stream) reads the bytes the buffer will hold."""
    stream = buf.__cuda_array_interface__["stream"]
    if stream is None:  # no stream of it left, and so no work of it to wait for
        return
    ev = Event(buf.device_id, timing=False)
    try:
        ev.record(stream)
        ev.synchronize()
    finally:
        ev.close()


def _header(buf: Buffer) -> dict[str, Any]:
    return {"size": buf.size, "device": buf.device_id}


def _arrival_device(header: Mapping[str, Any]) -> int:
    """Where a received Buffer is made: the device the plugin serves in this process, else the ordinal it
    had on the sender."""
    inst = _installed
    return inst.device if inst is not None else int(header["device"])


def _receive(header: Mapping[str, Any], frames: list[Any], op: str) -> Buffer:
    size = int(header["size"])
    if len(frames) != 1:
        raise error("CUDA_ERROR_INVALID_VALUE", f"{op}: a Buffer travels as one frame, got {len(frames)}", op=op)
    buf = Device(_arrival_device(header)).allocate(size)
    try:
        buf.copy_from(frames[0])  # host or device memory; a size that differs is refused
    except BaseException:
        buf.close()
        raise
    return buf


@cuda_serialize.register(Buffer)
def cuda_serialize_buffer(buf: Buffer) -> tuple[dict[str, Any], list[Any]]:
    """The ``"cuda"`` family: the Buffer itself is the one frame (device memory, with
    ``__cuda_array_interface__`` and ``nbytes``), for a transport that sends device memory."""
    _check_open(buf, "cudacore.dask.cuda_serialize")
    _settle(buf)
    return _header(buf), [buf]


@cuda_deserialize.register(Buffer)
def cuda_deserialize_buffer(header: dict[str, Any], frames: list[Any]) -> Buffer:
    """The ``"cuda"`` family's receiving side: the frame (device memory the transport received into) is
    copied, on the device, into a new Buffer of cudacore's on the receiving worker's device."""
    return _receive(header, frames, "cudacore.dask.cuda_deserialize")


@dask_serialize.register(Buffer)
def dask_serialize_buffer(buf: Buffer) -> tuple[dict[str, Any], list[Any]]:
    """The ``"dask"`` family: one host frame holding the Buffer's bytes, for TCP."""
    _check_open(buf, "cudacore.dask.dask_serialize")
    _settle(buf)
    host = bytearray(buf.size)
    buf.copy_to(host)
    return _header(buf), [memoryview(host)]


@dask_deserialize.register(Buffer)
def dask_deserialize_buffer(header: dict[str, Any], frames: list[Any]) -> Buffer:
    """The ``"dask"`` family's receiving side: the host frame copied into a new Buffer on the receiving
    worker's device."""
    return _receive(header, frames, "cudacore.dask.dask_deserialize")


@sizeof.register(Buffer)
def sizeof_buffer(buf: Buffer) -> int:
    """What Dask counts a Buffer as: its bytes (0 once closed), as it counts a CuPy array's, so that
    dask-cuda's device-memory accounting and spilling see it."""
    return 0 if buf.closed else int(buf.size)

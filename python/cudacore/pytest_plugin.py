"""pytest plugin for projects that use cudacore (registered by the ``pytest11`` entry point ``cudacore``).

The plugin only acts on what carries cudacore's name: its markers, fixtures, option and ini key. A project
that uses none of them is left as it is: no marker of a common name (a project's own ``gpu`` marker is its
own), and no call into cudacore, so CUDA is never initialised while pytest collects. A marked test is
checked when it is set up, in the process that runs it.

Markers
-------
``@pytest.mark.cudacore_gpu``
    Skip the test unless a real GPU is there (the CUDA backend, with at least one device).
``@pytest.mark.cudacore_leak_check``
    (or ``--cudacore-leak-check`` / ini ``cudacore_leak_check = true`` for every test;
    ``@pytest.mark.cudacore_leak_check(False)`` opts one out.) Fail the test (an error at teardown) if device memory allocated during it is still allocated after
    its fixtures are torn down and garbage is collected, listing each live Buffer with its size and the
    Python call site that allocated it.
``@pytest.mark.cudacore_memory_budget(nbytes, device=0)``
    Set ``Device.memory_limit`` to what is in use plus ``nbytes`` for the test: allocating past it raises
    :class:`cudacore.OutOfMemoryError`.
``@pytest.mark.cudacore_faults("cuMemAllocFromPoolAsync:3:2", ...)``
    On the simulator, inject driver faults (the CUDACORE_SIM_FAULTS syntax; nth counted from the test's
    setup) and clear them afterwards. Skips on a real GPU.

Fixtures
--------
``cudacore_device``
    ``cudacore.Device(0)``; skips when no device (or no driver) is there.
``cudacore_faults``
    A :class:`FaultInjector` (``inject(spec)``, ``inject_fault(entry, nth)``,
    ``fail_allocations(nth=1, device=None)``, ``clear()``), cleared after
    the test; skips unless on the simulator.

The plugin calls into cudacore (which chooses the backend on first use) only when a test needs it, so a
conftest that sets ``CUDACORE_BACKEND=sim`` at import still decides.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from . import testing
from ._device import Device, backend, device_count, unavailable_reason
from ._errors import CUDAError
from ._stream import StreamLike

__all__ = ["FaultInjector"]

_MARKERS = {
    "cudacore_gpu": "cudacore_gpu: needs a real CUDA GPU (cudacore's CUDA backend with a device); skipped otherwise",
    "cudacore_leak_check": "cudacore_leak_check(enabled=True): fail the test if it leaves device memory allocated",
    "cudacore_memory_budget": "cudacore_memory_budget(nbytes, device=0): cap the device memory the test may allocate",
    "cudacore_faults": "cudacore_faults(spec, ...): inject simulator driver faults ('entry:nth:code') for the test",
}

_has_gpu: bool | None = None
_watch_key = pytest.StashKey["_LeakWatch"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudacore")
    group.addoption(
        "--cudacore-leak-check",
        action="store_true",
        default=None,
        help="fail tests that leave cudacore device memory allocated, saying where it was allocated",
    )
    parser.addini("cudacore_leak_check", "leak-check every test (see --cudacore-leak-check)", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    # Idempotent: a project's conftest or ini may register cudacore's markers too.
    known = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name, line in _MARKERS.items():
        if name not in known:
            config.addinivalue_line("markers", line)


def on_simulator() -> bool:
    """Whether this process runs (or will run) cudacore on the simulator."""
    if "cudacore._native" in sys.modules:
        try:
            return backend() == "sim"
        except CUDAError:
            return False
    return os.environ.get("CUDACORE_BACKEND", "").strip().lower() == "sim"


def has_gpu() -> bool:
    """Whether a real GPU is usable: the CUDA backend with at least one device (cached for the session)."""
    global _has_gpu
    if _has_gpu is None:
        if os.environ.get("CUDACORE_BACKEND", "").strip().lower() not in ("", "cuda"):
            _has_gpu = False
        else:
            try:
                _has_gpu = backend() == "cuda" and device_count() > 0
            except Exception:  # noqa: BLE001 - DriverNotFoundError, or an extension that does not load
                _has_gpu = False
    return _has_gpu


GPU_SKIP_REASON = "needs a CUDA GPU (cudacore's CUDA backend with a device); none here"
FAULTS_SKIP_REASON = "cudacore fault injection needs the simulator (CUDACORE_BACKEND=sim)"


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_setup")
def pytest_runtest_setup_skip_unmet_markers(item: pytest.Item) -> None:
    """Skip ``item`` when its cudacore_gpu or cudacore_faults marker cannot be met here. Runs at the item's
    setup (inside every hook wrapper, as pytest's own skip marks do), never at collection: deciding needs
    the backend, and on the CUDA backend that initialises CUDA, which a process that only collects (or
    forks workers later) must not have done for it. (pytest takes hooks by a ``pytest_`` name; the
    specname makes this a second pytest_runtest_setup beside the leak check's wrapper.)"""
    if item.get_closest_marker("cudacore_gpu") is not None and not has_gpu():
        pytest.skip(GPU_SKIP_REASON)
    if item.get_closest_marker("cudacore_faults") is not None and not on_simulator():
        pytest.skip(FAULTS_SKIP_REASON)


# -- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture
def cudacore_device() -> Device:
    """``cudacore.Device(0)``; the test is skipped when there is no device or no driver."""
    if device_count() == 0:  # no driver, or no device: the reason says which
        pytest.skip(f"no CUDA device ({unavailable_reason()})")
    return Device(0)


class FaultInjector:
    """Run-time fault injection on the simulator (the ``cudacore_faults`` fixture)."""

    def inject(self, spec: str) -> int:
        """Add faults in the CUDACORE_SIM_FAULTS syntax, ``"entry[@ordinal]:nth:code[,...]"``, nth counted
        from now (see :func:`cudacore.testing.inject_faults`)."""
        return testing.inject_faults(spec)

    def inject_fault(
        self, entry: str, nth: int = 1, code: int | str = "CUDA_ERROR_OUT_OF_MEMORY", *, device: Device | int | None = None
    ) -> None:
        """Make the nth call from now of ``entry`` fail (see :func:`cudacore.testing.inject_fault`)."""
        testing.inject_fault(entry, nth, code, device=device)

    def fail_allocations(
        self, *, nth: int = 1, device: Device | int | None = None, code: int | str = "CUDA_ERROR_OUT_OF_MEMORY"
    ) -> None:
        """Make the nth allocation from now that reaches the driver on ``device`` fail (see
        :func:`cudacore.testing.fail_allocations`, which takes the same keyword arguments)."""
        testing.fail_allocations(nth=nth, device=device, code=code)

    def clear(self) -> None:
        """Remove every pending fault."""
        testing.clear_faults()


@pytest.fixture
def cudacore_faults() -> Iterator[FaultInjector]:
    """A :class:`FaultInjector`; its faults are cleared after the test. Skips unless on the simulator."""
    if not on_simulator():
        pytest.skip(FAULTS_SKIP_REASON)
    injector = FaultInjector()
    try:
        yield injector
    finally:
        injector.clear()


@pytest.fixture(autouse=True)
def _cudacore_markers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Applies cudacore_memory_budget and cudacore_faults markers (nothing is called without them)."""
    budget = request.node.get_closest_marker("cudacore_memory_budget")
    faults = request.node.get_closest_marker("cudacore_faults")
    if budget is None and faults is None:
        yield
        return
    restore = None
    if budget is not None:
        if not budget.args and "nbytes" not in budget.kwargs:
            raise pytest.UsageError(
                f"{request.node.nodeid}: @pytest.mark.cudacore_memory_budget needs the budget in bytes, "
                "e.g. @pytest.mark.cudacore_memory_budget(64 << 20)"
            )
        nbytes = budget.args[0] if budget.args else budget.kwargs["nbytes"]
        dev = Device(budget.kwargs.get("device", 0))
        old = dev.memory_limit
        dev.memory_limit = dev.memory_stats()["in_use"] + int(nbytes)
        restore = (dev, old)
    if faults is not None:
        for spec in faults.args:
            testing.inject_faults(spec)
    try:
        yield
    finally:
        if faults is not None:
            testing.clear_faults()
        if restore is not None:
            restore[0].memory_limit = restore[1]


# -- leak check -----------------------------------------------------------------------------------------------


class _LeakWatch:
    """Records the Python call site of every Buffer and PinnedBuffer allocated through Device while a test
    runs, and each device's memory in use (device and pinned) before it."""

    def __init__(self) -> None:
        self.sites: dict[int, tuple[weakref.ref[Any], str, int, traceback.StackSummary]] = {}
        self.baseline: dict[tuple[int, str], int] = {}
        self._saved: dict[str, Any] = {}

    def _record(self, buf: Any, kind: str) -> None:
        stack = traceback.StackSummary.from_list(traceback.extract_stack(limit=10)[:-2])  # drop the wrapper frames
        key = id(buf)

        def forget(_ref: weakref.ref[Any], k: int = key) -> None:
            self.sites.pop(k, None)

        self.sites[key] = (weakref.ref(buf, forget), kind, buf.size, stack)

    def _in_use(self) -> dict[tuple[int, str], int]:
        out = {}
        for ordinal, dev in list(Device._cache.items()):
            stats = dev.memory_stats()
            # Orphans (blocks of another library's stream, closed and waiting for a device synchronize to go
            # back: docs/guide/memory.md) were freed by their owner: no leak.
            out[(ordinal, "Buffer")] = stats["in_use"] - stats["orphaned"]
            out[(ordinal, "PinnedBuffer")] = stats["pinned_in_use"]
            out[(ordinal, "ManagedBuffer")] = stats["managed_in_use"]
            out[(ordinal, "SharedBuffer")] = stats["shared_in_use"]
        return out

    def start(self) -> None:
        gc.collect()
        self.baseline = self._in_use()
        allocate, allocate_tiles, allocate_pinned = Device.allocate, Device.allocate_tiles, Device.allocate_pinned
        allocate_managed, allocate_shareable = Device.allocate_managed, Device.allocate_shareable
        self._saved = {"allocate": allocate, "allocate_tiles": allocate_tiles, "allocate_pinned": allocate_pinned,
                       "allocate_managed": allocate_managed, "allocate_shareable": allocate_shareable}
        watch = self

        def tracked_allocate(self: Device, nbytes: int, stream: StreamLike = None) -> Any:
            buf = allocate(self, nbytes, stream)
            watch._record(buf, "Buffer")
            return buf

        def tracked_tiles(self: Device, count: int, tile_size: int, **kwargs: Any) -> Any:
            tiles = allocate_tiles(self, count, tile_size, **kwargs)
            for t in tiles:
                watch._record(t, "Buffer")
            return tiles

        def tracked_pinned(self: Device, nbytes: int) -> Any:
            buf = allocate_pinned(self, nbytes)
            watch._record(buf, "PinnedBuffer")
            return buf

        def tracked_managed(self: Device, nbytes: int) -> Any:
            buf = allocate_managed(self, nbytes)
            watch._record(buf, "ManagedBuffer")
            return buf

        def tracked_shareable(self: Device, nbytes: int, *args: Any, **kwargs: Any) -> Any:
            buf = allocate_shareable(self, nbytes, *args, **kwargs)
            watch._record(buf, "SharedBuffer")
            return buf

        tracked_shareable.__doc__ = allocate_shareable.__doc__
        Device.allocate_shareable = tracked_shareable  # type: ignore[method-assign]
        tracked_allocate.__doc__ = allocate.__doc__
        tracked_managed.__doc__ = allocate_managed.__doc__
        Device.allocate_managed = tracked_managed  # type: ignore[method-assign]
        tracked_tiles.__doc__ = allocate_tiles.__doc__
        tracked_pinned.__doc__ = allocate_pinned.__doc__
        Device.allocate = tracked_allocate  # type: ignore[method-assign]
        Device.allocate_tiles = tracked_tiles  # type: ignore[method-assign]
        Device.allocate_pinned = tracked_pinned  # type: ignore[method-assign]

    def stop(self) -> str | None:
        """Restore Device and return the leak report, or None when nothing leaked."""
        for name, fn in self._saved.items():
            setattr(Device, name, fn)
        gc.collect()
        live = []
        for ref, kind, size, stack in list(self.sites.values()):
            buf = ref()
            if buf is not None and not buf.closed:
                live.append((buf, kind, size, stack))
        grown = {}
        for key, now in self._in_use().items():
            delta = now - self.baseline.get(key, 0)
            if delta > 0:
                grown[key] = delta
        if not live and not grown:
            return None
        lines = []
        for kind in ("Buffer", "PinnedBuffer", "ManagedBuffer", "SharedBuffer"):
            mine = [entry for entry in live if entry[1] == kind]
            if not mine:
                continue
            total = sum(size for _, _, size, _ in mine)
            lines.append(f"{len(mine)} cudacore {kind}(s) still allocated after the test ({total} bytes):")
            for buf, _, size, stack in mine:
                lines.append(f"  {size} bytes at 0x{buf.ptr:x} on device {buf.device_id}, allocated at:")
                frames = [f for f in stack if "/_pytest/" not in f.filename and "/pluggy/" not in f.filename]
                for frame in frames[-5:]:  # most recent call last
                    lines.append(f"    {frame.filename}:{frame.lineno} in {frame.name}")
                    if frame.line:
                        lines.append(f"      {frame.line}")
        for (ordinal, kind), delta in grown.items():
            tracked = sum(size for buf, k, size, _ in live if k == kind and buf.device_id == ordinal)
            if delta > tracked:
                what = {"Buffer": "device memory", "PinnedBuffer": "pinned host memory", "SharedBuffer": "shareable memory"}.get(kind, "managed memory")
                lines.append(
                    f"device {ordinal}: {delta} bytes more {what} in use than before the test, {delta - tracked} of "
                    "them not through Device.allocate/allocate_pinned (an interop allocator, or C code)"
                )
        lines.append("Close buffers (buf.close() or `with device.allocate(n) as buf:`) before the test ends.")
        return "\n".join(lines)


def _leak_check_enabled(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("cudacore_leak_check")
    if marker is not None:
        return bool(marker.args[0]) if marker.args else bool(marker.kwargs.get("enabled", True))
    option = item.config.getoption("cudacore_leak_check", default=None)
    if option:
        return True
    return bool(item.config.getini("cudacore_leak_check"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if _leak_check_enabled(item):
        watch = _LeakWatch()
        watch.start()
        item.stash[_watch_key] = watch
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    watch = item.stash.get(_watch_key, None)
    if watch is not None:
        del item.stash[_watch_key]
        report = watch.stop()
        if report is not None:
            pytest.fail(f"cudacore leak check: {report}", pytrace=False)
    return result

"""The fault sweep (issue 11): every driver entry point the simulator models, times failure positions, times
result codes (sticky ones included), each injected into a workload that uses the whole public API.

    python tests/fault_sweep.py --full                 # every case; one JSON line of counts at the end
    python tests/fault_sweep.py --sample 120 --seed 3  # a random sample (what CI runs, tests/test_fault_sweep.py)
    python tests/fault_sweep.py --case cuMemcpyDtoH_v2:2:CUDA_ERROR_ILLEGAL_ADDRESS   # one case, verbosely

The entry points are read from the simulator's own table (``entryPoints`` in pkg/cudasim/driver.go), so
one it learns is swept without a change here. Each case runs in two ways:

- *in flight*: in a warm process, the fault is injected (``cudacore.testing.inject_faults``) and the
  workload runs; the Nth call of the entry point from then fails with the code;
- *at start*: in a fresh process, ``CUDACORE_SIM_FAULTS`` holds the fault before cudacore's first call,
  which reaches the entry points only used while a device is opened (``cuInit``, ``cuDeviceGet*``,
  ``cuDevicePrimaryCtxRetain``...). The full sweep runs these for every entry point; a sample runs some.

After each case the checks are: every exception the workload met is typed (as in tests/fuzz.py); once the
faults are cleared and everything is closed, ``in_use``, ``pinned_in_use``, the live streams, events,
graphs and captures, and the device's free memory are back at the baseline; and the same workload then
runs again with no error at all (no failure is remembered). A case whose fault was never reached (the
workload does not call the entry point that many times) is counted as such, not as a pass.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import fuzz

#: Positions: the Nth call of the entry point after the fault is injected.
POSITIONS = (1, 2, 3)
#: Codes: ordinary failures, and sticky ones (the real driver's context is lost after those).
CODES = ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_UNKNOWN")
STICKY = frozenset({"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"})
#: Positions and codes of the fresh-process cases (each costs a process start).
START_POSITIONS = (1, 2)
START_CODES = ("CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_ILLEGAL_ADDRESS")


#: The simulated devices of every sweep process: two H100s that are peers (device 0 as in a plain run).
SIM_DEVICES = json.dumps([{}, {}])


def entry_points() -> list[str]:
    """The entry points the simulator models, from its table in pkg/cudasim/driver.go."""
    text = (ROOT / "pkg" / "cudasim" / "driver.go").read_text()
    m = re.search(r"func init\(\) \{\s*for _, n := range strings\.Fields\(`([^`]*)`\)", text)
    if m is None:
        raise RuntimeError("pkg/cudasim/driver.go: the entryPoints table was not found; update tests/fault_sweep.py")
    return m.group(1).split()


def cases(full: bool, sample: int, seed: int) -> tuple[list[str], list[str]]:
    """The in-flight and at-start cases ("entry:nth:code"), all of them or a seeded sample."""
    eps = entry_points()
    inflight = [f"{e}:{n}:{c}" for e in eps for n in POSITIONS for c in CODES]
    start = [f"{e}:{n}:{c}" for e in eps for n in START_POSITIONS for c in START_CODES]
    if full:
        return inflight, start
    rng = random.Random(seed)
    return rng.sample(inflight, min(sample, len(inflight))), rng.sample(start, min(max(4, sample // 10), len(start)))


# -- the workload ------------------------------------------------------------------------------------------


class Workload:
    """Every kind of call, each step on its own: a failed step is counted and the next one runs."""

    def __init__(self, cc: Any, importer: str | None = None) -> None:
        self.cc = cc
        # The fault for an importing child process (see import_in_child), or None: no child.
        self.importer = importer
        self.child_fired = False
        self.errors: list[str] = []  # typed errors met
        self.untyped: list[str] = []
        self.objects: list[Any] = []  # everything to close, in creation order
        self.unclosed: list[Any] = []  # what close() failed to close: retried once the faults are cleared

    def step(self, name: str, fn: Callable[[], Any], expect: tuple[type[BaseException], ...] = ()) -> Any:
        """``fn()``, or None if it raised; ``expect``: what it raises even without a fault (not counted)."""
        try:
            return fn()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            if expect and type(exc) in expect and "fault injected" not in str(exc):
                return None
            if fuzz.typed(self.cc, exc):
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            else:
                self.untyped.append(f"{name}: untyped {type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}")
            return None

    def keep(self, obj: Any) -> Any:
        if obj is not None:
            self.objects.append(obj)
        return obj

    def run(self) -> None:
        import numpy as np

        cc = self.cc
        step, keep = self.step, self.keep
        d = step("device", lambda: cc.Device(0))
        if d is None:
            return
        step("properties", lambda: (d.name, d.total_memory, d.allocation_strategy, cc.device_count(), cc.driver_version()))
        step("memory_info", d.memory_info)
        # The shared pool first (a pool of cudacore's own is made before cudacore allocates); closed last.
        if keep(step("share_pool", lambda: cc.share_pool(d, release_threshold=1 << 30, libraries=[]))) is not None:
            step("share_pool_again", lambda: cc.share_pool(d, libraries=[]))
        # Another library's out-of-memory error explained: the verdict's driver reads and its probe.
        rmm_oom = MemoryError("std::bad_alloc: out_of_memory: CUDA error (failed to allocate 1048576 bytes) at: x.cpp:1")
        step("explain_oom", lambda: cc.explain_oom(rmm_oom, d))
        n = 64 << 10
        s = keep(step("create_stream", lambda: d.create_stream()))
        s2 = keep(step("create_blocking_stream", lambda: d.create_stream(non_blocking=False, priority=-1)))
        a = keep(step("allocate", lambda: d.allocate(n, stream=s)))
        b = keep(step("allocate_legacy", lambda: d.allocate(n)))
        big = keep(step("allocate_big", lambda: d.allocate(64 << 20, stream=s)))  # above the cache's blocks
        tiles = step("allocate_tiles", lambda: d.allocate_tiles(4, 4096, stream=s)) or []
        for t in tiles:
            keep(t)
        p = keep(step("allocate_pinned", lambda: d.allocate_pinned(n)))
        q = keep(step("allocate_pinned_2", lambda: d.allocate_pinned(n)))
        data = np.arange(n, dtype=np.uint8)
        if a is not None:
            step("copy_from_numpy", lambda: a.copy_from(data))
            step("copy_from_bytes_async", lambda: a.copy_from(data.tobytes(), stream=s))
            if p is not None:
                step("fill_pinned", lambda: p.numpy().__setitem__(slice(None), data))
                step("copy_from_pinned_async", lambda: a.copy_from(p, stream=s))
            if b is not None:
                step("device_to_device", lambda: cc.device_to_device(b, a))
                step("device_to_device_async", lambda: cc.device_to_device(b, a, stream=s))
            if q is not None:
                step("copy_to_pinned_async", lambda: a.copy_to(q, stream=s))
            step("copy_to_bytearray", lambda: a.copy_to(bytearray(n)))
            # Pageable copies on a stream are staged through pinned buffers that are recycled once their
            # copy is done: enough of them to wait for the oldest.
            for i in range(12):
                step(f"staged_copy_from_{i}", lambda: a.copy_from(data, stream=s))
                step(f"staged_copy_to_{i}", lambda: a.copy_to(np.empty(n, dtype=np.uint8), stream=s))
        if big is not None and a is not None:
            step("device_to_device_big", lambda: cc.device_to_device(big, a, nbytes=n))
        e1 = keep(step("event", lambda: cc.Event(d)))
        e2 = keep(step("event_2", lambda: cc.Event(d)))
        if s is not None and e1 is not None and e2 is not None:
            step("record", lambda: e1.record(s))
            step("query_stream", s.query)
            step("record_2", lambda: e2.record(s))
            step("event_synchronize", e2.synchronize)
            step("event_query", e1.query)
            step("elapsed", lambda: e1.elapsed_time(e2))
            if s2 is not None:
                step("stream_wait", lambda: s2.wait(e2))
        if s is not None:
            step("stream_synchronize", s.synchronize)
        # Captures: the block form in each mode, then the explicit form on a blocking stream, aborted.
        graphs = []
        for mode in fuzz.MODES:
            if s is None or a is None or p is None:
                break

            def capture(mode: str = mode) -> Any:
                with s.capture(mode) as g:
                    a.copy_from(p, stream=s)
                    tmp = d.allocate(4096, stream=s)  # graph memory, freed inside the graph
                    try:
                        cc.device_to_device(tmp, a, stream=s, nbytes=4096)
                    finally:
                        tmp.close()
                return g

            g = keep(step(f"capture_{mode}", capture))
            if g is not None:
                graphs.append(g)
                step("graph_info", lambda g=g: (g.node_count, g.memory_held, g.allocations))
                dot = os.path.join(tempfile.gettempdir(), f"cudacore-fault-sweep-{os.getpid()}.dot")
                step("debug_dot", lambda g=g, dot=dot: (g.debug_dot(dot, verbose=True), os.unlink(dot)))
                step("upload", lambda g=g: g.upload(s))
                step("launch", lambda g=g: g.launch(s))
        # Two graphs of one topology (no graph memory, which makes every capture's own): update one from the other.
        pair = []
        for i in range(2):
            if s is None or a is None or b is None:
                break

            def plain(i: int = i) -> Any:
                with s.capture("thread_local") as g:
                    cc.device_to_device(b, a, stream=s, nbytes=n - i)
                return g

            g = keep(step(f"capture_plain_{i}", plain))
            if g is not None:
                pair.append(g)
        if len(pair) == 2:
            step("update", lambda: pair[0].update(pair[1]))
            step("launch_updated", lambda: pair[0].launch(s))
        # A capture across two streams: s2 joins s's capture, allocates graph memory there, and is joined back.
        if s is not None and s2 is not None and a is not None:

            def forked() -> Any:
                with s.capture("thread_local") as g:
                    s2.wait(s.record())
                    tmp = d.allocate(4096, stream=s2)
                    try:
                        cc.device_to_device(tmp, a, stream=s2, nbytes=4096)
                    finally:
                        tmp.close()
                    s.wait(s2.record())
                return g

            g = keep(step("capture_forked", forked))
            if g is not None:
                step("launch_forked", lambda g=g: g.launch(s))
        if s2 is not None and b is not None:
            step("begin_capture", lambda: s2.begin_capture("relaxed"))
            step("copy_in_capture", lambda: cc.device_to_device(b, b, stream=s2))
            step("release_during_capture", d.release_cached_memory)
            step("abort_capture", s2.abort_capture)
        if graphs:
            step("destroy_graph", graphs[-1].destroy)
        self.shared(d, s)
        self.peers(d, s, a)
        self.capture_tools(d, s, a, b)
        # Interop views, limits, the module loader, the allocator's settings.
        if a is not None:
            from cudacore import interop

            v = step("dlpack", lambda: interop.from_dlpack(a))
            if v is not None:
                step("close_dlpack_view", v.close)
            step("cai", lambda: a.__cuda_array_interface__)
        step("limits", lambda: d.limits.as_dict())
        step("set_limit", lambda: d.limits.set("malloc_heap_size", d.limits.get("malloc_heap_size")))
        m = keep(step("load_module", lambda: d.load_module(HERE / "kernels" / "fill.ptx")))
        if m is not None and a is not None:
            k = step("function", lambda: m.function("fill"))
            if k is not None:
                step("attributes", lambda: k.attributes.as_dict())
                # The simulator runs no device code: the launch reaches cuLaunchKernel, which refuses it.
                step("launch_kernel", lambda: k.launch(grid=1, block=32, args=(a, 7, 16), stream=s), expect=(cc.NotSupportedError,))
        step("memory_stats", d.memory_stats)
        step("would_fit", lambda: d.would_fit(4, 4096))
        step("limit", lambda: setattr(d, "memory_limit", 1 << 40))
        step("limit_off", lambda: setattr(d, "memory_limit", None))
        step("synchronize", d.synchronize)
        step("release_cached_memory", d.release_cached_memory)

    def shared(self, d: Any, s: Any) -> None:
        """Managed memory, shareable memory of both kinds exported (and opened here, which is a view of it:
        importing needs another process), an interprocess event and its handle (which this process cannot
        open: the driver refuses, so only an injected fault is counted)."""
        cc, step, keep = self.cc, self.step, self.keep
        mb = keep(step("allocate_managed", lambda: d.allocate_managed(4096)))
        if mb is not None:
            step("copy_to_managed", lambda: mb.copy_from(bytes(4096)))
        for kind in ("pool", "ipc"):
            sb = keep(step(f"allocate_shareable_{kind}", lambda kind=kind: d.allocate_shareable(4096, stream=s, kind=kind)))
            if sb is None:
                continue
            step(f"copy_to_shareable_{kind}", lambda sb=sb: sb.copy_from(bytes(4096), stream=s))
            h = keep(step(f"export_{kind}", sb.export))
            if h is not None and self.importer is not None and IMPORTS[_entry(self.importer)] == kind:
                step(f"import_in_child_{kind}", lambda h=h: self.import_in_child(h))
            if h is not None:
                v = keep(step(f"open_here_{kind}", h.open))
                if v is not None:
                    step(f"copy_from_view_{kind}", lambda v=v: v.copy_to(bytearray(4096)))
                    step(f"close_view_{kind}", v.close)
                if kind == "pool":
                    self.more_shared(d, s, sb, h)
        ev = keep(step("event_interprocess", lambda: cc.Event(d, interprocess=True)))
        if ev is not None and s is not None:
            step("record_interprocess", lambda: ev.record(s))
            eh = step("event_ipc_handle", ev.ipc_handle)
            if eh is not None:
                opened = keep(step("open_own_event_handle", eh.open, expect=(cc.InvalidHandleError,)))
                del opened

    def more_shared(self, d: Any, s: Any, sb: Any, h: Any) -> None:
        """The rest of a pool SharedBuffer's public calls: opened through the import path here (the handle
        names another live process, the parent, as its exporter), read and closed; a pickling round trip;
        a handle sent and received over a socket."""
        import pickle
        import socket

        cc, step, keep = self.cc, self.step, self.keep
        imported = keep(step("open_imported", lambda: _open_foreign(cc, h)))
        if imported is not None:
            step("copy_from_imported", lambda: imported.copy_to(bytearray(imported.size)))
            step("close_imported", imported.close)
        view = keep(step("pickle_shared", lambda: pickle.loads(pickle.dumps(sb))))
        if view is not None:
            step("close_pickled_view", view.close)
        a, b = socket.socketpair(socket.AF_UNIX)
        with a, b:
            step("send_handle", lambda: h.send(a))
            keep(step("receive_handle", lambda: cc.IpcHandle.receive(b)))

    def capture_tools(self, d: Any, s: Any, a: Any, b: Any) -> None:
        """graphed (its capture, a replay, a reset), rehearse, tiles with a progress callback, managed
        memory's prefetch and advice."""
        cc, step, keep = self.cc, self.step, self.keep
        if s is not None and a is not None and b is not None:

            def fn() -> None:
                with d.allocate(4096, stream=s) as tmp:
                    cc.device_to_device(tmp, a, stream=s, nbytes=4096)
                    cc.device_to_device(b, tmp, stream=s, nbytes=4096)

            g = step("graphed", lambda: cc.graphed(fn, stream=s))
            if g is not None:
                step("graphed_capture", g)
                step("graphed_replay", g)
                step("graphed_info", lambda: (repr(g), g.eager))
                step("graphed_reset", g.reset)

            def body(stream: Any) -> None:
                cc.device_to_device(b, a, stream=stream, nbytes=4096)
                with d.allocate(64, stream=stream):
                    pass

            step("rehearse", lambda: str(cc.rehearse(body, s)))
        tiles = step("allocate_tiles_progress", lambda: d.allocate_tiles(3, 4096, progress=lambda done, total: True)) or []
        for t in tiles:
            keep(t)
        mb = keep(step("allocate_managed_hinted", lambda: d.allocate_managed(8192)))
        if mb is not None:
            step("managed_advise", lambda: mb.advise("read_mostly", d))
            step("managed_prefetch", lambda: mb.prefetch(d, stream=s))
            step("managed_prefetch_cpu", lambda: mb.prefetch("cpu"))

    def import_in_child(self, h: Any) -> None:
        """Open ``h`` in a child process whose simulator has the fault ``self.importer`` (importing is what
        only another process does): each error there must be typed, and the child must exit cleanly,
        having closed what it opened (the exporter's close then frees the memory: checked by the sweep)."""
        fds = h.fds()
        env = _env({"CUDACORE_SIM_FAULTS": self.importer or ""})
        r = subprocess.run([sys.executable, "-c", _IMPORTER, json.dumps(h._meta()), json.dumps(fds)], pass_fds=fds,
                           capture_output=True, text=True, timeout=60, env=env, check=False)  # fmt: skip
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 or not lines:
            self.untyped.append(f"the importing child exited {r.returncode}: {r.stderr[-3000:]}")
            return
        out = json.loads(lines[-1])
        self.child_fired = self.child_fired or out["fired"]
        self.errors += [f"in the importing child: {e}" for e in out["errors"]]
        self.untyped += [f"in the importing child: {e}" for e in out["untyped"]]

    def peers(self, d: Any, s: Any, a: Any) -> None:
        """A second device, where the sweep has one (CUDACORE_SIM_DEVICES, see _env): peer access, copies
        between the devices, and shareable memory on the peer."""
        from cudacore import _topology as topology
        from cudacore import interop

        cc, step, keep = self.cc, self.step, self.keep
        if (step("device_count", cc.device_count) or 0) < 2:
            return
        d1 = step("device_1", lambda: cc.Device(1))
        if d1 is None:
            return
        step("can_access_peer", lambda: (d.can_access_peer(d1), d1.can_access_peer(d)))
        step("link", lambda: (topology.link(0, 1), topology.link(1, 0)))
        step("nccl_memory_path", lambda: (interop.nccl_memory_path(0), interop.nccl_memory_path(1)))
        step("enable_peer_access", lambda: d.enable_peer_access(d1))
        step("enable_peer_access_back", lambda: d1.enable_peer_access(d))
        n = 64 << 10
        b1 = keep(step("allocate_on_peer", lambda: d1.allocate(n)))
        if b1 is not None and a is not None:
            step("peer_copy", lambda: cc.device_to_device(b1, a))
            if s is not None:
                step("peer_copy_async", lambda: cc.device_to_device(b1, a, stream=s))
                step("peer_copy_async_back", lambda: cc.device_to_device(a, b1, stream=s))
                step("peer_synchronize", s.synchronize)
        sb1 = keep(step("allocate_shareable_peer", lambda: d1.allocate_shareable(4096, kind="pool")))
        if sb1 is not None:
            h1 = keep(step("export_peer", sb1.export))
            if h1 is not None:
                imported = keep(step("open_imported_peer", lambda: _open_foreign(cc, h1)))
                if imported is not None and a is not None:
                    step("peer_copy_to_imported", lambda: cc.device_to_device(imported, a, nbytes=4096))
            # Refused while the import is open (closed, in order, at the end).
            step("close_shareable_peer", sb1.close, expect=(cc.IllegalStateError,))
        m1 = keep(step("allocate_managed_peer", lambda: d1.allocate_managed(4096)))
        if m1 is not None and a is not None and s is not None:
            step("peer_copy_managed", lambda: cc.device_to_device(m1, a, stream=s, nbytes=4096))
        step("peer_release_cached_memory", d1.release_cached_memory)

    def close(self) -> None:
        """Close everything, newest first (graphs before the buffers they use); errors are counted, and
        what failed to close is kept in ``unclosed``."""
        for obj in reversed(self.objects):
            closer = getattr(obj, "destroy", None) or getattr(obj, "unload", None) or obj.close
            met = len(self.errors) + len(self.untyped)
            self.step(f"close {type(obj).__name__}", closer)
            if len(self.errors) + len(self.untyped) > met:
                self.unclosed.append(obj)
        self.objects.clear()
        # The synchronous allocator (cuMemAlloc_v2, cuMemFree_v2), then back: refused if anything leaked.
        d = self.cc.Device(0)
        if self.step("strategy_sync", lambda: d.set_allocation_strategy("sync")) is None and d.allocation_strategy == "sync":
            self.step("sync_allocate", lambda: d.allocate(4096).close())
        self.step("strategy_auto", lambda: d.set_allocation_strategy("auto"))


#: The entry points only a process importing shared memory calls, and the kind of memory it imports: the
#: in-flight cases of these open an export in a child process with the fault (Workload.import_in_child).
IMPORTS = {"cuIpcOpenMemHandle_v2": "ipc", "cuIpcCloseMemHandle": "ipc", "cuMemPoolImportFromShareableHandle": "pool",
           "cuMemPoolImportPointer": "pool"}  # fmt: skip

#: The importing child: opens the handle (meta, fds) three times, reads it, closes it (again once the faults
#: are cleared, if that failed, which must unmap it); prints what it met.
_IMPORTER = """
import json, os, sys, traceback
import cudacore as cc
from cudacore import _ipc, testing
from cudacore._native import core
meta, fds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
errors, untyped, fired = [], [], False

def met(what, exc):
    typed = isinstance(exc, cc.CUDAError)
    (errors if typed else untyped).append(f"{what}: {type(exc).__name__}: {exc}" + ("" if typed else traceback.format_exc()))

for i in range(3):
    buf = None
    try:
        with _ipc._from_meta(meta, [os.dup(fd) for fd in fds]) as h:
            buf = h.open()
        buf.copy_to(bytearray(buf.size))
    except Exception as exc:
        met(f"open {i}", exc)
    if buf is None:
        continue
    device, ptr = buf.device_id, buf.ptr
    try:
        buf.close()
    except Exception as exc:
        met(f"close {i}", exc)
        fired = fired or testing.clear_faults() == 0
        try:
            buf.close()  # again, the fault gone: this must unmap it
        except Exception as exc:
            untyped.append(f"close {i} again, the faults cleared: {type(exc).__name__}: {exc}")
        try:
            core.ShareClose(device, ptr, meta["kind"])
            untyped.append(f"close {i}: closing again left the memory mapped")
        except cc.CUDAError:
            pass
fired = fired or testing.clear_faults() == 0
print(json.dumps({"fired": fired, "errors": errors, "untyped": untyped}))
"""

#: The known bug #8 (see tests/fuzz.py, KNOWN_BUGS): a buffer allocated in a capture that failed or was
#: aborted cannot be closed ("not the start of a live allocation") and its bytes stay in in_use.
KNOWN_8 = "not the start of a live allocation"


def _known(errors: list[str], violations: list[str]) -> list[str]:
    """The known bugs that explain every violation of a case ([] if any is unexplained)."""
    if violations and any(KNOWN_8 in e for e in errors):
        leaks = ("in_use is", "free is", "still has", KNOWN_8)
        if all(any(m in v for m in leaks) for v in violations):
            return ["#8"]
    return []


def _open_foreign(cc: Any, h: Any) -> Any:
    """Open pool handle ``h`` through the import path, as another process would (see fuzz_mix._foreign)."""
    import fuzz_mix

    with fuzz_mix._foreign(cc, h) as other:
        return other.open()


_warm = [False]


def _baseline(cc: Any) -> dict[str, Any]:

    import fuzz_mix

    if not _warm[0]:
        # What cudacore and multiprocessing keep for the process once a feature is first used (each
        # exportable pool's descriptor, the pool the import path imports, the event an export waits with,
        # the resource sharer): made before the first baseline, so that no case is charged with it.
        fuzz_mix.warm_up(cc)
        _warm[0] = True
    out = fuzz.snapshot(cc)
    # Shared and managed memory of both devices and the open descriptors (less the exportable pools'),
    # as the fuzzer's new mix checks them; the events cudacore keeps for exports are not the case's.
    fuzz_mix.snapshot(cc, out)
    if cc.device_count() > 1:  # the peer (see _env): its memory comes back too
        d1 = cc.Device(1)
        try:
            d1.synchronize()
            d1.release_cached_memory()
        except Exception as exc:  # noqa: BLE001 - reported as the case's violation
            out.setdefault("error", f"device 1: {type(exc).__name__}: {exc}")
        out["peer in_use"] = d1.memory_stats()["in_use"]
        out["peer free"] = d1.memory_info()[0]
    return out


def run_case(cc: Any, spec: str | None, verbose: bool = False) -> dict[str, Any]:
    """One in-flight case (``spec`` None: the workload alone). Returns its record."""
    from cudacore import testing

    before = _baseline(cc)
    w = Workload(cc, importer=spec if spec is not None and _entry(spec) in IMPORTS else None)
    if spec is not None:
        testing.inject_faults(spec)
    w.run()
    w.close()  # with the faults still armed: the closes and frees are swept too
    pending = testing.clear_faults()
    # What failed to close is closed again, as a caller would after an error: it must work now.
    retry = Workload(cc)
    retry.objects, w.unclosed = w.unclosed, []
    retry.close()
    gc.collect()
    violations = list(w.untyped) + retry.untyped
    violations += [f"after clearing the faults, closing again failed: {e[:1500]}" for e in retry.errors]
    after = _baseline(cc)
    violations += fuzz._compare(before, after)
    if violations and not w.untyped:
        time.sleep(0.01)
        violations = fuzz._compare(before, _baseline(cc))
    # With the faults gone the same workload must run cleanly: no failure is remembered.
    again = Workload(cc)
    again.run()
    again.close()
    if again.errors or again.untyped:
        violations.append(f"after clearing the faults the workload still fails: {(again.errors + again.untyped)[0][:1500]}")
    rec = {"case": spec, "fired": pending == 0 or w.child_fired, "errors": len(w.errors), "violations": violations,
           "known": _known(w.errors + again.errors, violations)}  # fmt: skip
    if verbose:
        rec["error_list"] = w.errors
    return rec


def start_case(spec: str) -> dict[str, Any]:
    """One at-start case, in this (fresh) process: the fault was in CUDACORE_SIM_FAULTS before import."""
    import cudacore as cc
    from cudacore import testing

    w = Workload(cc)
    w.run()
    w.close()
    try:
        pending = testing.clear_faults()
    except BaseException as exc:  # noqa: BLE001 - the sim failed to start: only typed is acceptable
        if not fuzz.typed(cc, exc):
            return {"case": spec, "fired": True, "errors": 0, "violations": [f"clear_faults: untyped {exc!r}"]}
        return {"case": spec, "fired": True, "errors": 0, "violations": [f"clear_faults raised {exc!r}"]}
    retry = Workload(cc)
    retry.objects = w.unclosed
    retry.close()
    violations = list(w.untyped) + retry.untyped
    violations += [f"after clearing the faults, closing again failed: {e[:1500]}" for e in retry.errors]
    # The process's baseline is now, after the failure; a clean workload must come back to it.
    before = _baseline(cc)
    again = Workload(cc)
    again.run()
    again.close()
    if again.errors or again.untyped:
        violations.append(f"after clearing the faults the workload still fails: {(again.errors + again.untyped)[0][:1500]}")
    violations += fuzz._compare(before, _baseline(cc))
    return {"case": "start " + spec, "fired": pending == 0, "errors": len(w.errors), "violations": violations,
            "known": _known(w.errors + again.errors, violations)}  # fmt: skip


# -- running the sweep -------------------------------------------------------------------------------------


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    # Two simulated devices that are peers: the workload reaches peer access and copies between devices.
    env["CUDACORE_SIM_DEVICES"] = SIM_DEVICES
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _worker_batch(specs: list[str], timeout: float) -> list[dict[str, Any]]:
    """Run in-flight cases in worker processes, as many per process as go well; a crash or a hang is a
    violation of the case that was running, and the rest go on in a new process."""
    results: list[dict[str, Any]] = []
    todo = list(specs)
    while todo:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(todo)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        current = None
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        import select

        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                if time.monotonic() > deadline:
                    proc.kill()
                continue
            line = proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            if "start" in msg:
                current, deadline = msg["start"], time.monotonic() + timeout
                continue
            results.append(msg)
            todo.remove(msg["case"])
            current = None
        rc = proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if current is not None:
            results.append({"case": current, "fired": True, "errors": 0,
                            "violations": [f"the process died or hung in this case (exit {rc}): {err[-3000:]}"]})  # fmt: skip
            todo.remove(current)
        elif todo and rc != 0:
            results.append({"case": todo[0], "fired": True, "errors": 0, "violations": [f"the worker exited {rc}: {err[-3000:]}"]})
            todo.pop(0)
    return results


def _start_case_proc(spec: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--start-case", spec]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env({"CUDACORE_SIM_FAULTS": spec}), check=False)
    except subprocess.TimeoutExpired:
        return {"case": "start " + spec, "fired": True, "errors": 0, "violations": ["the process hung"]}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"case": "start " + spec, "fired": True, "errors": 0, "violations": [f"the process exited {r.returncode}: {r.stderr[-3000:]}"]}
    return json.loads(lines[-1])


def _entry(case: str) -> str:
    return case.removeprefix("start ").split(":")[0]


def sweep(inflight: list[str], start: list[str], timeout: float = 120, progress: bool = False) -> dict[str, Any]:
    """Run the cases; returns counts and the failures."""
    t0 = time.monotonic()
    results = _worker_batch(inflight, timeout)
    if progress:
        print(f"{len(results)} in-flight cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    for i, spec in enumerate(start):
        results.append(_start_case_proc(spec, timeout))
        if progress and (i + 1) % 25 == 0:
            print(f"{i + 1} at-start cases, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    failed = [r for r in results if r["violations"] and not r.get("known")]
    known: dict[str, list[str]] = {}
    for r in results:
        if r["violations"] and r.get("known"):
            for k in r["known"]:
                known.setdefault(k, []).append(r["case"])
    return {
        "cases": len(results),
        "entry_points": len(entry_points()),
        "fired": sum(r["fired"] for r in results),
        "not_reached": sum(not r["fired"] for r in results),
        # Entry points whose fault no case reached: the workload (or the start) does not call them.
        "never_reached": sorted({_entry(r["case"]) for r in results} - {_entry(r["case"]) for r in results if r["fired"]}),
        "typed_errors": sum(r["errors"] for r in results),
        "known": known,
        "failed": failed,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="every case")
    ap.add_argument("--sample", type=int, default=120, help="in-flight cases of a sample (default 120)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed")
    ap.add_argument("--case", help="run one in-flight case here, printing its errors")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a case may take")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--start-case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        import cudacore as cc

        run_case(cc, None)  # warm: the device is open and every lazily made object exists
        for spec in json.loads(args.worker):
            print(json.dumps({"start": spec}), flush=True)
            rec = run_case(cc, spec)
            print(json.dumps(rec), flush=True)
            if rec["violations"]:
                return 0  # the next case starts in a fresh process, untouched by this one
        return 0
    if args.start_case is not None:
        print(json.dumps(start_case(args.start_case)), flush=True)
        return 0
    if args.case is not None:
        os.environ["CUDACORE_BACKEND"] = "sim"
        os.environ.setdefault("CUDACORE_SIM_DEVICES", SIM_DEVICES)
        import cudacore as cc

        run_case(cc, None)
        print(json.dumps(run_case(cc, args.case, verbose=True), indent=1))
        return 0
    inflight, start = cases(args.full, args.sample, args.seed)
    summary = sweep(inflight, start, args.timeout, args.progress)
    for r in summary["failed"]:
        print(f"{r['case']}: {r['violations'][0][:2000]}", file=sys.stderr)
    summary["failed"] = [r["case"] for r in summary["failed"]]
    print(json.dumps(summary))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

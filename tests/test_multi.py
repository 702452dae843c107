"""Several devices and several processes on the simulator: peer access and copies, shareable memory sent to
spawned processes, its lifetime rules, and events shared between processes.

The simulator's devices are fixed per process, so the multi-device cases run in fresh interpreters with
``CUDACORE_SIM_DEVICES`` (three devices: 0 and 1 are peers, 2 is in another peer group). Memory crosses
processes for real: the simulator keeps shareable memory in shared memory (see docs/guide/multi-gpu.md).
"""

from __future__ import annotations

import json
import os
import pickle
import textwrap
from pathlib import Path

import pytest

import cudacore as cc

from conftest import run_python

pytestmark = pytest.mark.sim


@pytest.fixture(autouse=True)
def _give_back_shareable_memory() -> object:
    """The in-process tests leave device 0 as they found it: freed shareable blocks back to the device."""
    yield
    cc.Device(0).release_cached_memory()

THREE = json.dumps(
    [
        {"name": "sim0", "total_memory": 1 << 30},
        {"name": "sim1", "total_memory": 1 << 30},
        {"name": "sim-far", "total_memory": 1 << 30, "peer_group": 1},
    ]
)


def _run(code: str, backend: str = "sim", **env: str) -> str:
    base = {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": THREE} if backend == "sim" else {"CUDACORE_BACKEND": backend}
    r = run_python(textwrap.dedent(code), env={**base, **env}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# -- several devices ----------------------------------------------------------------------------------------


def test_peer_matrix_and_enabling() -> None:
    out = _run(
        """
        import cudacore as cc
        d0, d1, d2 = cc.devices()
        print([[a.can_access_peer(b) for b in (d0, d1, d2)] for a in (d0, d1, d2)])
        d0.enable_peer_access(d1)
        d0.enable_peer_access(1)  # idempotent, by ordinal too
        for call in (lambda: d0.enable_peer_access(d2), lambda: d0.enable_peer_access(d0)):
            try:
                call()
            except cc.CUDAError as e:
                print(type(e).__name__, e.name)
        try:
            d0.can_access_peer("1")
        except TypeError as e:
            print("TypeError")
        try:
            d0.can_access_peer(7)
        except cc.CUDAError as e:
            print(type(e).__name__)
        """
    )
    lines = out.splitlines()
    assert lines[0] == "[[False, True, False], [True, False, False], [False, False, False]]"
    assert lines[1] == "NotSupportedError CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"
    assert lines[2] == "InvalidValueError CUDA_ERROR_INVALID_VALUE"
    assert lines[3] == "TypeError"
    assert lines[4] == "InvalidValueError"


def test_peer_copies_sync_async_and_ordered_with_events() -> None:
    out = _run(
        """
        import cudacore as cc
        d0, d1, d2 = cc.devices()
        n = 1 << 16
        data = bytes(i % 251 for i in range(n))
        a, b, c = d0.allocate(n), d1.allocate(n), d2.allocate(n)
        a.copy_from(data)
        cc.device_to_device(b, a)                      # synchronous, between peers
        cc.device_to_device(c, b)                      # synchronous, without peer access (staged)
        out = bytearray(n); c.copy_to(out); print(out == data)
        s1, s2 = d1.create_stream(), d2.create_stream()
        b.copy_from(b"\\x07" * n)
        cc.device_to_device(a, b, s1)                  # on the source device's stream
        ev = cc.Event(d1, timing=False).record(s1)
        s2.wait_event(ev)                               # another device's stream waits on the event
        cc.device_to_device(c, a, s2, nbytes=100)      # on the destination device's stream
        s2.synchronize()
        c.copy_to(out); print(out[:100] == b"\\x07" * 100, out[100:] == data[100:])
        try:
            cc.device_to_device(b, a, s2)
        except cc.InvalidValueError as e:
            print("other device's stream:", "either" in str(e))
        try:
            cc.device_to_device(b, a, s1.handle)
        except TypeError:
            print("int handle: TypeError")
        try:
            cc.device_to_device(b, a, nbytes=n + 1)
        except cc.InvalidValueError:
            print("too long: InvalidValueError")
        a.close()
        try:
            cc.device_to_device(b, a)
        except cc.CUDAError as e:
            print("closed:", e.name)
        """
    )
    assert out.splitlines() == [
        "True",
        "True True",
        "other device's stream: True",
        "int handle: TypeError",
        "too long: InvalidValueError",
        "closed: CUDACORE_ERROR_CLOSED",
    ]


def test_a_peer_copy_never_names_graph_memory_no_launch_made_real() -> None:
    """Graph memory has no memory behind it before its graph's first launch; a peer copy naming it is
    refused on whichever device's stream it runs, the far device's side included."""
    out = _run(
        """
        import cudacore as cc
        d0, d1, _ = cc.devices()
        n = 1 << 16
        a = d0.allocate(n)
        a.copy_from(b"\\x05" * n)
        s0, s1 = d0.create_stream(), d1.create_stream()
        with s1.capture() as g:
            b = d1.allocate(n, stream=s1)        # graph memory of device 1, not real until g is launched
        for label, dst, src, stream in [("far side", b, a, s0), ("near side", a, b, s1), ("sync", b, a, None)]:
            try:
                cc.device_to_device(dst, src, stream)
                print(label, "copied")
            except cc.IllegalStateError as e:
                print(label, "refused:", "never launched" in str(e))
        g.launch(s1)
        s1.synchronize()
        cc.device_to_device(b, a, s0)            # real now
        s0.synchronize()
        out = bytearray(n)
        b.copy_to(out)
        print("after the launch:", out == b"\\x05" * n)
        b.close(); g.destroy(); a.close()
        print("in use:", d0.memory_stats()["in_use"], d1.memory_stats()["in_use"])
        """
    )
    assert out.splitlines() == [
        "far side refused: True",
        "near side refused: True",
        "sync refused: True",
        "after the launch: True",
        "in use: 0 0",
    ]


def test_peer_copies_from_many_threads() -> None:
    """Every operation runs in the right context from any thread: threads that never touched a device copy
    between all pairs at once."""
    out = _run(
        """
        import threading
        import cudacore as cc
        devs = cc.devices()
        errors, done = [], []
        def work(k):
            try:
                src = devs[k % 3].allocate(4096)
                dst = devs[(k + 1) % 3].allocate(4096)
                src.copy_from(bytes([k]) * 4096)
                s = dst.device.create_stream()
                for _ in range(20):
                    cc.device_to_device(dst, src, s)
                s.synchronize()
                out = bytearray(4096); dst.copy_to(out)
                done.append(out == bytes([k]) * 4096)
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work, args=(k,)) for k in range(12)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(errors, done.count(True))
        """
    )
    assert out.strip() == "[] 12"


def test_library_allocators_on_three_devices_from_many_threads() -> None:
    """The allocators cudacore hands other libraries (CuPy's, through a stand-in of its allocator API, and
    the doors PyTorch's allocator calls) allocate on three devices from six threads at once, while other
    threads capture in every mode, close streams, switch device 1's strategy and enable peer access: no
    thread is left waiting, every error is typed, each device is reported done once nothing captures,
    and nothing stays allocated (peer access itself is checked in Go: process.TestLibraryAllocatesUnderManyThreads)."""
    out = _run(
        r'''
        import ctypes, random, sys, threading, types, traceback
        import cudacore as cc
        from cudacore import interop

        _local = threading.local()
        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset
        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=None):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id
        class Stream:  # CuPy's null stream, as cudacore knows CuPy's streams: by module and class name
            ptr = 0
        Stream.__module__ = "cupy.cuda.stream"
        NULL = Stream()
        cupy = types.ModuleType("cupy")
        cupy.cuda = types.SimpleNamespace(
            memory=types.SimpleNamespace(MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory),
            runtime=types.SimpleNamespace(getDevice=lambda: getattr(_local, "device", 0)),
            get_current_stream=lambda: NULL,
        )
        sys.modules["cupy"] = cupy

        lib = ctypes.CDLL(interop.extension_path())
        # The doors the PyTorch shim calls (the shim itself throws a C++ exception on failure, which only PyTorch catches).
        lib.cudacore_door_TorchMalloc.restype = ctypes.c_void_p
        lib.cudacore_door_TorchMalloc.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
        lib.cudacore_door_TorchFree.restype = ctypes.c_void_p
        lib.cudacore_door_TorchFree.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
        libc = ctypes.CDLL(None)
        def door(fn, *args):
            out = ctypes.c_int64(0)
            err = fn(*args, ctypes.byref(out))
            if not err:
                return out.value, None
            text = ctypes.string_at(err).decode()
            libc.free(ctypes.c_void_p(err))
            return 0, text

        devs = cc.devices()
        before = [d.memory_stats()["in_use"] for d in devs]
        alloc = interop.cupy_allocator()
        errors = []
        stop = threading.Event()

        def guarded(fn):
            def run(*a):
                try:
                    fn(*a)
                except BaseException:
                    errors.append(traceback.format_exc())
            return run

        @guarded
        def allocator(k):
            r = random.Random(k)
            for i in range(300):
                o = r.randrange(3)
                _local.device = o
                if r.random() < 0.5:
                    try:
                        p = alloc(r.choice([0, 1, 4096, 1 << 20]))
                    except cc.CaptureError:
                        continue
                    del p
                else:
                    s = devs[o].create_stream() if r.random() < 0.3 else None
                    h = s.handle if s else 0
                    p, text = door(lib.cudacore_door_TorchMalloc, 4096, o, h)
                    if p:
                        assert door(lib.cudacore_door_TorchFree, p) == (0, None)
                    else:
                        assert text.startswith("cuda[900 "), text
                        interop.last_error()
                    if s: s.close()

        @guarded
        def capturer(k):
            r = random.Random(k)
            while not stop.is_set():
                d = devs[r.randrange(3)]
                s = d.create_stream()
                try:
                    with s.capture(mode=r.choice(["global", "thread_local", "relaxed"])) as g:
                        b = d.allocate(4096, stream=s)
                        b.close()
                    g.launch(s); s.synchronize(); g.destroy()
                except cc.CaptureError:
                    pass
                s.close()

        @guarded
        def peers(k):
            r = random.Random(k)
            while not stop.is_set():
                a, b = r.sample([0, 1], 2)
                devs[a].enable_peer_access(b)
                try:
                    devs[2].enable_peer_access(r.randrange(2))
                except cc.NotSupportedError:
                    pass

        @guarded
        def churn(k):
            r = random.Random(k)
            while not stop.is_set():
                s = devs[r.randrange(3)].create_stream()
                try:
                    s.synchronize()
                except cc.CaptureError:
                    pass  # refused during another thread's GLOBAL capture
                s.close()
                try:
                    devs[1].set_allocation_strategy(r.choice(["pool", "sync"]))
                except cc.CUDAError:
                    pass

        workers = [threading.Thread(target=allocator, args=(k,)) for k in range(6)]
        others = [threading.Thread(target=f, args=(k,)) for k, f in enumerate([capturer, capturer, peers, churn])]
        for t in workers + others: t.start()
        for t in workers: t.join(120)
        stop.set()
        for t in others: t.join(120)
        alive = [t.name for t in workers + others if t.is_alive()]
        import gc; gc.collect()
        devs[1].set_allocation_strategy("pool")
        print("alive", alive)
        print("errors", len(errors))
        for e in errors[:5]: print(e)
        from cudacore._api import core
        print("opened", [core.LibraryAllocates(o, 0) for o in range(3)])
        print("torch_live", interop.torch_live_allocations())
        print("in_use", [d.memory_stats()["in_use"] - b for d, b in zip(devs, before)])
        '''
    )
    assert out.splitlines() == ["alive []", "errors 0", "opened [1, 1, 1]", "torch_live 0", "in_use [0, 0, 0]"], out


# -- several processes ---------------------------------------------------------------------------------------

SPAWN = """
import multiprocessing as mp, os, sys, time
import cudacore as cc

def reader(buf, q):
    out = bytearray(buf.size); buf.copy_to(out)
    buf.copy_from(b"\\xaa" * buf.size)
    q.put((type(buf).__name__, bytes(out[:8])))
    buf.close()

def holder(handle, q, go):
    buf = handle.open()
    handle.close()
    q.put(os.getpid())
    go.wait(60)
    out = bytearray(buf.size); buf.copy_to(out); q.put(bytes(out[:4]))
    buf.close()
    q.put("closed")

def opener(handle, q):
    try:
        handle.open()
        q.put("opened")
    except cc.CUDAError as e:
        q.put(type(e).__name__)

def via_queue(qi, qo):
    buf = qi.get()
    out = bytearray(buf.size); buf.copy_to(out); qo.put(bytes(out[:4])); buf.close()

def via_socket(sock, q):
    h = cc.IpcHandle.receive(sock)
    with h, h.open() as buf:
        out = bytearray(buf.size); buf.copy_to(out); q.put(bytes(out[:4]))

def exporter(q, go):
    sb = cc.Device(0).allocate_shareable(64)
    q.put(sb.export())
    go.wait(60)          # the handle has arrived; exit without closing anything

def event_waiter(eh, q):
    ev = eh.open()
    s = cc.Device(0).create_stream()
    s.wait_event(ev)
    ev.synchronize()
    s.synchronize()
    q.put(ev.interprocess)

def event_object_waiter(ev, q):
    cc.Device(0).create_stream().wait_event(ev)
    q.put(type(ev).__name__)
"""


def _spawn_run(body: str, allocator: str, backend: str = "sim") -> list[str]:
    code = SPAWN + "\nif __name__ == '__main__':\n    ctx = mp.get_context('spawn')\n" + textwrap.indent(textwrap.dedent(body), "    ")
    return _run(code, backend, CUDACORE_ALLOCATOR=allocator).splitlines()


def check_shared_buffer_into_spawn_workers(allocator: str, kind: str, backend: str = "sim") -> None:
    out = _spawn_run(
        """
        d = cc.Device(0)
        sb = d.allocate_shareable(4096)
        print(sb.kind)
        sb.copy_from(bytes(range(8)) * 512)
        q = ctx.Queue()
        p = ctx.Process(target=reader, args=(sb, q)); p.start()       # pickled into the worker's arguments
        print(q.get(timeout=60)); p.join(); print(p.exitcode)
        out = bytearray(4096); sb.copy_to(out); print(out == b"\\xaa" * 4096)  # the worker's writes are here
        sb.copy_from(b"\\x01\\x02\\x03\\x04" * 1024)
        qi, qo = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=via_queue, args=(qi, qo)); p.start()
        qi.put(sb); print(qo.get(timeout=60)); p.join()                # through a Queue
        import socket
        a, b = socket.socketpair()
        p = ctx.Process(target=via_socket, args=(b, qo)); p.start()
        with sb.export() as h:
            h.send(a)                                                   # SCM_RIGHTS over a socket of ours
        print(qo.get(timeout=60)); p.join()
        sb.close(); print(sb.closed)
        """,
        allocator,
        backend,
    )
    assert out == [
        kind,
        "('ImportedBuffer', b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')",
        "0",
        "True",
        "b'\\x01\\x02\\x03\\x04'",
        "b'\\x01\\x02\\x03\\x04'",
        "True",
    ]


def check_exporter_cannot_free_what_an_importer_holds(allocator: str, backend: str = "sim") -> None:
    out = _spawn_run(
        """
        d = cc.Device(0)
        sb = d.allocate_shareable(1024)
        sb.copy_from(b"\\x05" * 1024)
        q, go = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=holder, args=(sb.export(), q, go)); p.start()
        child = q.get(timeout=60)
        try:
            sb.close()
        except cc.IllegalStateError as e:
            print("refused:", str(child) in str(e), sb.closed)
        go.set()
        print(q.get(timeout=60), q.get(timeout=60))                   # the memory was still valid
        p.join()
        sb.close(); print("closed:", sb.closed)
        # A handle of memory the exporter closed opens nothing.
        sb2 = d.allocate_shareable(64)
        h = sb2.export()
        sb2.close()
        p = ctx.Process(target=opener, args=(h, q)); p.start(); print(q.get(timeout=60)); p.join()
        """,
        allocator,
        backend,
    )
    assert out == ["refused: True False", "b'\\x05\\x05\\x05\\x05' closed", "closed: True", "IllegalStateError"]


def check_kind_chosen_per_buffer(backend: str = "sim") -> None:
    """On a pool device, kind="ipc" gives cuMemAlloc memory with a cuIpc handle: it crosses the same way."""
    out = _spawn_run(
        """
        d = cc.Device(0)
        sb = d.allocate_shareable(64, kind="ipc")
        print(d.allocation_strategy, sb.kind)
        sb.copy_from(bytes(range(64)))
        q = ctx.Queue()
        p = ctx.Process(target=reader, args=(sb, q)); p.start(); print(q.get(timeout=60)); p.join()
        sb.close()
        """,
        "pool",
        backend,
    )
    assert out == ["pool ipc", "('ImportedBuffer', b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')"]


def check_handle_of_an_exited_exporter_is_refused(backend: str = "sim") -> None:
    out = _spawn_run(
        """
        q, go = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=exporter, args=(q, go)); p.start()
        h = q.get(timeout=60)
        go.set(); p.join()
        try:
            h.open()
        except cc.IllegalStateError as e:
            print("IllegalStateError", "exited" in str(e) or "closed" in str(e))
        """,
        "pool",
        backend,
    )
    assert out == ["IllegalStateError True"]


def check_importer_that_exits_without_closing_releases_its_hold(backend: str = "sim") -> None:
    out = _spawn_run(
        """
        d = cc.Device(0)
        sb = d.allocate_shareable(256)
        q = ctx.Queue()
        p = ctx.Process(target=opener, args=(sb.export(), q)); p.start()
        print(q.get(timeout=60)); p.join()                            # it opened and exited holding it
        sb.close(); print(sb.closed)
        """,
        "pool",
        backend,
    )
    assert out == ["opened", "True"]


def check_collected_shared_buffer_stays_valid_while_held(backend: str = "sim") -> None:
    out = _spawn_run(
        """
        import gc
        d = cc.Device(0)
        sb = d.allocate_shareable(1 << 20)
        sb.copy_from(b"\\x09" * (1 << 20))
        free_before = d.memory_info()[0]
        q, go = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=holder, args=(sb.export(), q, go)); p.start()
        q.get(timeout=60)
        del sb; gc.collect()                                            # collected while the child holds it
        print(d.memory_info()[0] < free_before + (1 << 20))            # not freed yet
        go.set(); print(q.get(timeout=60), q.get(timeout=60)); p.join()
        d.allocate_shareable(64).close()                                # a later shareable call frees it
        print(d.memory_info()[0] >= free_before)
        """,
        "sync",
        backend,
    )
    assert out == ["True", "b'\\t\\t\\t\\t' closed", "True"]


def check_event_shared_between_processes(backend: str = "sim") -> None:
    out = _spawn_run(
        """
        ev = cc.Event(0, interprocess=True)
        print(ev.timing, ev.interprocess)
        ev.record()
        q = ctx.Queue()
        p = ctx.Process(target=event_waiter, args=(ev.ipc_handle(), q)); p.start()
        print(q.get(timeout=60)); p.join()
        p = ctx.Process(target=event_object_waiter, args=(ev, q)); p.start()    # the Event itself pickles
        print(q.get(timeout=60)); p.join()
        """,
        "pool",
        backend,
    )
    assert out == ["False True", "True", "Event"]


# The checks above run here on the simulator, and in tests/test_multi_gpu.py on the real driver.

ALLOCATORS = [("pool", "pool"), ("sync", "ipc")]


@pytest.mark.parametrize(("allocator", "kind"), ALLOCATORS)
def test_shared_buffer_into_spawn_workers(allocator: str, kind: str) -> None:
    check_shared_buffer_into_spawn_workers(allocator, kind)


@pytest.mark.parametrize("allocator", ["pool", "sync"])
def test_exporter_cannot_free_what_an_importer_holds(allocator: str) -> None:
    check_exporter_cannot_free_what_an_importer_holds(allocator)


def test_kind_chosen_per_buffer() -> None:
    check_kind_chosen_per_buffer()


def test_kind_pool_needs_memory_pools() -> None:
    devices = json.dumps([{"total_memory": 1 << 30, "memory_pools_supported": False}])
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        print(d.allocate_shareable(64).kind)
        for kind in ("pool", "bogus"):
            try:
                d.allocate_shareable(64, kind=kind)
            except cc.CUDAError as e:
                print(type(e).__name__)
        """,
        CUDACORE_SIM_DEVICES=devices,
    )
    assert out.splitlines() == ["ipc", "NotSupportedError", "InvalidValueError"]


@pytest.mark.parametrize("code", ["1", "801"])  # INVALID_VALUE (the H100 test machine's answer), NOT_SUPPORTED
def test_a_driver_that_refuses_to_export_pool_blocks_shares_ipc_memory(code: str) -> None:
    """A driver that makes exportable pools but refuses cuMemPoolExportPointer (the H100 test machine, for
    NVIDIA's documented sequence too): the default kind is "ipc", which works end to end, and kind="pool"
    is a NotSupportedError that says why. The probe runs once: the refusal is remembered."""
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        with d.allocate_shareable(4096) as sb:
            print(sb.kind, type(sb.export()).__name__)
        try:
            d.allocate_shareable(64, kind="pool")
        except cc.NotSupportedError as e:
            print("refused:", "refuses to export" in str(e), "cuMemPoolExportPointer" in str(e))
        print(d.allocate_shareable(64).kind)
        """,
        CUDACORE_SIM_FAULTS=f"cuMemPoolExportPointer:1:{code}",
    )
    assert out.splitlines() == ["ipc IpcHandle", "refused: True True", "ipc"]


def test_a_transient_failure_of_the_export_probe_is_not_remembered() -> None:
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        try:
            d.allocate_shareable(64, kind="pool")
        except cc.CUDAError as e:
            print(type(e).__name__)
        with d.allocate_shareable(64) as sb:
            print(sb.kind)
        """,
        # OUT_OF_MEMORY, not a refusal; twice, as an allocation out of memory is tried once more
        CUDACORE_SIM_FAULTS="cuMemPoolExportPointer:1:2,cuMemPoolExportPointer:2:2",
    )
    assert out.splitlines() == ["OutOfMemoryError", "pool"]


def test_handle_of_an_exited_exporter_is_refused() -> None:
    check_handle_of_an_exited_exporter_is_refused()


def test_importer_that_exits_without_closing_releases_its_hold() -> None:
    check_importer_that_exits_without_closing_releases_its_hold()


def test_collected_shared_buffer_stays_valid_while_held() -> None:
    check_collected_shared_buffer_stays_valid_while_held()


def test_event_shared_between_processes() -> None:
    check_event_shared_between_processes()


# -- in this process ------------------------------------------------------------------------------------------


def test_shared_buffer_here() -> None:
    d = cc.Device(0)
    sb = d.allocate_shareable(512)
    assert isinstance(sb, cc.SharedBuffer)
    assert isinstance(sb, cc.Buffer)
    assert sb.kind == d.allocation_strategy.replace("sync", "ipc")
    sb.copy_from(b"\x03" * 512)
    with sb.export() as h:
        assert len(h.fds()) == (2 if sb.kind == "pool" else 1)
        view = h.open()  # in the exporting process: a view of the same memory
        assert view.ptr == sb.ptr
        out = bytearray(512)
        view.copy_to(out)
        assert out == b"\x03" * 512
    assert "SharedBuffer" in repr(sb)
    again = pickle.loads(pickle.dumps(sb))  # unpickled in the exporting process: a view, no import
    assert type(again) is cc.Buffer
    assert again.ptr == sb.ptr
    again.close()
    later = sb.export()
    with pytest.raises(cc.IllegalStateError, match="opened from an IpcHandle in this process"):
        sb.close()  # the view opened above still uses the memory
    assert not sb.closed
    view.close()
    sb.close()
    sb.close()  # idempotent
    assert "closed" in repr(sb)
    with pytest.raises(cc.CUDAError) as exc:
        sb.export()
    assert exc.value.name == "CUDACORE_ERROR_CLOSED"
    with pytest.raises(cc.IllegalStateError):
        later.open()  # its memory is closed
    later.close()


def test_closed_handle_and_bad_arguments() -> None:
    d = cc.Device(0)
    sb = d.allocate_shareable(64)
    h = sb.export()
    h.close()
    h.close()
    with pytest.raises(cc.CUDAError) as exc:
        h.open()
    assert exc.value.name == "CUDACORE_ERROR_CLOSED"
    with pytest.raises(cc.CUDAError):
        pickle.dumps(h)
    sb.close()
    with pytest.raises(TypeError):
        d.allocate_shareable("64")  # type: ignore[arg-type]
    with pytest.raises(cc.InvalidValueError):
        d.allocate_shareable(0)
    with pytest.raises(cc.InvalidValueError):
        d.allocate_shareable(-1)


def test_plain_buffer_refuses_pickling_with_the_fix() -> None:
    with cc.Device(0).allocate(64) as buf, pytest.raises(TypeError, match="allocate_shareable"):
        pickle.dumps(buf)


def test_interprocess_event_rules() -> None:
    ev = cc.Event(0, interprocess=True)
    assert ev.interprocess and not ev.timing
    h = ev.ipc_handle()
    assert pickle.loads(pickle.dumps(h)).handle == h.handle
    with pytest.raises(cc.InvalidHandleError) as exc:
        h.open()  # the driver refuses its own process's handle
    assert exc.value.name == "CUDA_ERROR_INVALID_CONTEXT"
    with pytest.raises(cc.InvalidValueError):
        cc.Event(0, interprocess=True, timing=True)
    plain = cc.Event(0)
    assert plain.timing and not plain.interprocess
    with pytest.raises(cc.InvalidValueError):
        plain.ipc_handle()
    with pytest.raises(TypeError, match="interprocess"):
        pickle.dumps(plain)
    ev.close()
    plain.close()


def test_peer_access_on_one_device() -> None:
    d = cc.Device(0)
    assert d.can_access_peer(d) is False
    with pytest.raises(cc.InvalidValueError):
        d.enable_peer_access(0)


# -- doctor and the benchmark -----------------------------------------------------------------------------------


def test_doctor_shows_peer_matrix_and_ipc_kinds() -> None:
    from conftest import run_cli

    devices = json.dumps([{"total_memory": 1 << 30}, {"total_memory": 1 << 30, "memory_pools_supported": False}, {"total_memory": 1 << 30, "peer_group": 3}])
    env = {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": devices}
    r = run_cli(["doctor"], env=env)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "peer access (row can access column)" in text
    assert "  dev 0      -  yes   no\n" in text
    assert "  dev 2     no   no    -\n" in text
    # device 1 has no pools: no exportable pool, cuIpc still works
    dev1 = text.split("  device 1\n")[1].split("  device 2\n")[0]
    assert dev1.splitlines()[0].split()[:2] == ["posix_fd", "no"]
    assert "CUDA_ERROR_NOT_SUPPORTED" in dev1
    assert dev1.splitlines()[2].split()[:2] == ["cuipc_mem", "works"]
    r = run_cli(["doctor", "--json"], env=env)
    topo = json.loads(r.stdout)["topology"]
    assert topo["peer_access"] == [[False, True, False], [True, False, False], [False, False, False]]
    assert topo["ipc"][0] == {"posix_fd": "ok", "cuipc_mem": "ok", "cuipc_event": "ok"}


LINKED = json.dumps(
    [
        {"name": "a", "total_memory": 1 << 30, "nvlinks": 18},
        {"name": "b", "total_memory": 1 << 30, "nvlinks": 12},
        {"name": "c", "total_memory": 1 << 30},
        {"name": "far", "total_memory": 1 << 30, "nvlinks": 18, "peer_group": 1},
    ]
)


def test_doctor_shows_the_link_between_each_pair() -> None:
    """NVLink and its width (the smaller count of the two ends), PCIe and where the devices meet on it,
    and the driver's attributes, for each pair once; --json has the same under topology.links."""
    from conftest import run_cli

    env = {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": LINKED}
    r = run_cli(["doctor"], env=env)
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("links between devices\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[:5] for line in section] == [
        ["dev", "0", "-", "dev", "1"],
        ["dev", "0", "-", "dev", "2"],
        ["dev", "0", "-", "dev", "3"],
        ["dev", "1", "-", "dev", "2"],
        ["dev", "1", "-", "dev", "3"],
        ["dev", "2", "-", "dev", "3"],
    ]
    assert "NVLink x12;" in section[0]
    # The widest kind, through a switch, is still apart from what follows it.
    from cudacore._topology import describe_link

    wide = describe_link({"kind": "nvlink", "nvlinks": 18, "nvswitch": True, "access": 1, "native_atomics": 1, "performance_rank": 0})
    assert wide.startswith("NVLink x18 (through NVSwitch); peer access yes"), wide
    assert "peer access yes, native atomics yes, performance rank 0" in section[0]
    assert "PCIe (PIX)" in section[1]
    assert "peer access yes, native atomics no, performance rank 1" in section[1]
    assert "PCIe (SYS)" in section[2]
    assert "peer access no, native atomics no" in section[2]
    assert "NVML" not in r.stdout.split("links between devices")[1].split("sharing with other processes")[0]
    r = run_cli(["doctor", "--json"], env=env)
    links = json.loads(r.stdout)["topology"]["links"]
    assert [entry["devices"] for entry in links] == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert links[0] == {
        "devices": [0, 1], "access": True, "native_atomics": True, "performance_rank": 0, "kind": "nvlink",
        "nvlinks": 12, "nvswitch": False, "pcie": "PIX", "nvml": "ok",
    }
    assert links[2]["kind"] == "pcie" and links[2]["pcie"] == "SYS" and links[2]["access"] is False


def test_links_without_nvml_and_their_errors() -> None:
    """Without NVML the kind of link is unknown and doctor says why; the driver's attributes stay. A
    device with itself, or one that does not exist, is an InvalidValueError."""
    out = _run(
        """
        import io, json
        import cudacore as cc
        from cudacore import testing
        from cudacore._topology import link, render_topology, topology

        testing.set_memory_conditions(1, {"no_nvml": True})
        got = link(0, 1)
        print(json.dumps(got))
        buf = io.StringIO()
        render_topology(topology(), buf)
        print(buf.getvalue())
        for a, b in ((0, 0), (0, 7), (-1, 1)):
            try:
                link(a, b)
            except cc.InvalidValueError as e:
                print("refused", a, b, e)
        """,
        CUDACORE_SIM_DEVICES=LINKED,
    )
    first = json.loads(out.splitlines()[0])
    assert first["kind"] == "" and first["pcie"] == "" and first["nvlinks"] == 0
    assert first["access"] is True and first["native_atomics"] is True
    assert "NVML (libnvidia-ml.so.1) is not available" in first["nvml"]
    assert "dev 0 - dev 1   unknown (no NVML)" in out
    assert "dev 0 - dev 2   PCIe (PIX)" in out, "device 2 still has NVML"
    assert "  NVML: NVML (libnvidia-ml.so.1) is not available" in out
    assert "refused 0 0 device 0 is itself" in out
    assert "refused 0 7 device 7 does not exist: there are 4 devices" in out
    assert "refused -1 1 device -1 does not exist" in out


def test_link_probe_during_a_global_capture() -> None:
    """The link probe opens no device and makes no call a capture forbids: a GLOBAL capture on either device
    goes on (the same on the GPU: tests/test_multi_gpu.py)."""
    out = _run(
        """
        import cudacore as cc
        from cudacore._topology import link

        from cudacore._topology import topology

        # Before device 1 is ever opened: topology() reads links and the peer matrix without opening a
        # device, and its sharing probe is refused before it would open one.
        s = cc.Device(0).create_stream()
        s.begin_capture("global")
        link(0, 1), link(1, 0), link(0, 2)
        try:
            topology()
        except cc.CaptureError as e:
            assert e.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", e
        s.end_capture().destroy()
        s.close()
        s = cc.Device(1).create_stream()
        s.begin_capture("global")
        link(0, 1), link(1, 0), link(0, 2)
        s.end_capture().destroy()
        s.close()
        print("ok")
        """,
        CUDACORE_SIM_DEVICES=LINKED,
    )
    assert out.strip() == "ok"


def test_topology_function_in_process() -> None:
    from cudacore._topology import topology

    topo = topology()
    n = cc.device_count()
    assert len(topo["peer_access"]) == n
    assert all(not topo["peer_access"][i][i] for i in range(n))
    assert topo["links"] == [] if n == 1 else len(topo["links"]) == n * (n - 1) // 2
    assert set(topo["ipc"][0]) == {"posix_fd", "cuipc_mem", "cuipc_event"}


def test_bench_runs_on_the_simulator() -> None:
    import subprocess
    import sys

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["PYTHONPATH"] = str(ROOT / "python")
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "multi_gpu.py"), "--sim", "--rounds", "2"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("backend sim, 1 device(s), 2 interleaved rounds")
    for kind in ("pool", "ipc"):
        assert any(line.startswith(f"ipc round trip   64 KiB  cudacore ({kind})") and line.rstrip().endswith("x     -") for line in lines)
    assert any("peer copy" in line and "skipped: needs 2 devices" in line for line in lines)
    assert any("all_reduce" in line and "skipped" in line for line in lines)
    # With two simulated devices the peer rows run (cudacore alone: no cuda.bindings or CuPy here).
    env["CUDACORE_SIM_DEVICES"] = json.dumps([{"total_memory": 1 << 30}, {"total_memory": 1 << 30}])
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "multi_gpu.py"), "--sim", "--rounds", "1"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(line.startswith("peer copy    1 MiB  cudacore") and "GB/s" in line for line in r.stdout.splitlines()), r.stdout


# -- the Numba plug-in's get_ipc_handle, against a stand-in for Numba's API ----------------------------------

FAKE_NUMBA = {
    "numba/__init__.py": "",
    "numba/cuda/cudadrv/__init__.py": "",
    "numba/cuda/__init__.py": textwrap.dedent(
        """
        import collections
        MemoryInfo = collections.namedtuple("MemoryInfo", "free total")

        class HostOnlyCUDAMemoryManager:
            def __init__(self, context):
                self.context = context
            def initialize(self):
                pass
            def reset(self):
                pass

        class MemoryPointer:
            def __init__(self, context, pointer, size, owner=None, finalizer=None):
                self.context, self.handle, self.size, self._owner, self.finalizer = context, pointer, size, owner, finalizer
            @property
            def owner(self):
                return self if self._owner is None else self._owner
        """
    ),
    "numba/cuda/cudadrv/driver.py": textwrap.dedent(
        """
        USE_NV_BINDING = False

        class IpcHandle:
            def __init__(self, base, handle, size, source_info=None, offset=0):
                self.base, self.handle, self.size, self.source_info, self.offset = base, handle, size, source_info, offset
            @classmethod
            def _rebuild(cls, handle_ary, size, source_info, offset):
                return cls(None, bytes(b & 0xFF for b in handle_ary), size, source_info, offset)
        """
    ),
}

NUMBA_PROBE = """
import json, types
import cudacore as cc
from cudacore import interop
from cudacore._api import call, core
from numba import cuda

dev = types.SimpleNamespace(id=0, get_device_identity=lambda: {"pci_bus_id": "sim"})
emm = interop.NumbaMemoryManager(types.SimpleNamespace(device=dev))
mem = emm.memalloc(4096)
view = cuda.MemoryPointer(mem.context, type(mem.handle)(mem.handle.value + 256), 1024, owner=mem)
try:
    h = emm.get_ipc_handle(view)
except cc.NotSupportedError as e:
    print(json.dumps({"refused": str(e)}))
else:
    want = json.loads(call(core.ShareExport, 0, mem.handle.value, "ipc"))["handle"]
    print(json.dumps({"same_handle": h.handle.hex() == want, "offset": h.offset, "size": h.size,
                      "base_is_memory": h.base is view, "source": h.source_info}))
"""


@pytest.mark.parametrize("allocator", ["sync", "pool"])
def test_numba_get_ipc_handle(tmp_path: Path, allocator: str) -> None:
    for name, text in FAKE_NUMBA.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    from conftest import ROOT

    env = {"CUDACORE_BACKEND": "sim", "CUDACORE_ALLOCATOR": allocator, "PYTHONPATH": f"{tmp_path}:{ROOT / 'python'}"}
    r = run_python(NUMBA_PROBE, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    if allocator == "pool":
        assert "CUDACORE_ALLOCATOR=sync" in out["refused"]
    else:
        assert out == {"same_handle": True, "offset": 256, "size": 1024, "base_is_memory": True, "source": {"pci_bus_id": "sim"}}


def test_shareable_memory_is_refused_during_a_capture() -> None:
    d = cc.Device(0)
    s = d.create_stream()
    s.begin_capture()
    try:
        with pytest.raises(cc.CaptureError, match="before or after the capture"):
            d.allocate_shareable(64)
    finally:
        s.abort_capture()
        s.close()
    d.allocate_shareable(64).close()  # and fine again after it


def test_shared_buffer_outlives_its_stream() -> None:
    d = cc.Device(0)
    s = d.create_stream()
    sb = d.allocate_shareable(256, stream=s)
    sb.copy_from(b"\x01" * 256, stream=s)
    s.close()
    with sb.export() as h:  # the stream is gone, and so is the work it had: nothing to wait for
        assert h.size == 256
    sb.close()
    assert sb.closed


def test_allreduce_example_says_what_it_needs_on_the_simulator() -> None:
    import subprocess
    import sys

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env.update(CUDACORE_BACKEND="sim", PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "allreduce.py")], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "this example needs 2 GPUs (the CUDA backend)"


def test_release_cached_memory_gives_back_the_exportable_pool() -> None:
    d = cc.Device(0)
    d.release_cached_memory()
    free = d.memory_info()[0]
    d.allocate_shareable(1 << 20, kind="pool").close()
    assert d.memory_info()[0] < free  # the freed block stays reserved for reuse
    d.release_cached_memory()
    assert d.memory_info()[0] == free


# -- an importer whose unmapping fails (found by tests/fault_sweep.py) ---------------------------------------

_UNMAP_FAILS = """
import json, sys
import cudacore as cc
from cudacore import _ipc, testing
from cudacore._native import core
meta, fds, fault = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
with _ipc._from_meta(meta, fds) as h:
    buf = h.open()
ptr = buf.ptr
testing.inject_faults(fault)
try:
    buf.close()
    print("closed", flush=True)
except cc.CUDAError as e:
    print("failed", type(e).__name__, flush=True)
sys.stdin.readline()  # the exporter tries to free it now
testing.clear_faults()
buf.close()  # again, the fault gone: this unmaps it
try:
    core.ShareClose(0, ptr, meta["kind"])
    print("still mapped", flush=True)
except cc.CUDAError:
    print("unmapped", flush=True)
"""


@pytest.mark.parametrize(("kind", "fault"), [("ipc", "cuIpcCloseMemHandle:1:CUDA_ERROR_UNKNOWN"), ("pool", "cuMemFree_v2:1:CUDA_ERROR_UNKNOWN")])
def test_an_import_whose_unmapping_failed_stays_open_until_closed_again(kind: str, fault: str) -> None:
    """A failed unmapping (cuIpcCloseMemHandle, or cuMemFree of a pool import) leaves the memory mapped: the
    importer keeps holding it (the exporter cannot free it) and a second close() unmaps it. It used to
    mark the mapping closed and give the hold back: the second close did nothing and the mapping leaked."""
    import subprocess
    import sys

    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind=kind)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    with sb.export() as h:
        fds = h.fds()
        p = subprocess.Popen([sys.executable, "-c", _UNMAP_FAILS, json.dumps(h._meta()), json.dumps(fds), fault], pass_fds=fds,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().split() == ["failed", "CUDAError"]
        with pytest.raises(cc.IllegalStateError, match="still hold"):
            sb.close()  # the importer still maps it
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
        assert out.split() == ["unmapped"], out + err
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
    sb.close()


def test_a_stream_of_another_device_cannot_join_a_capture() -> None:
    """docs/guide/capture.md: streams of another device cannot join a capture; refused before the driver, and
    the capture goes on."""
    out = _run(
        """
        import cudacore as cc
        d0, d1, _ = cc.devices()
        s, other = d0.create_stream(), d1.create_stream()
        with s.capture() as g:
            try:
                other.wait(s.record())
            except cc.CUDAError as e:
                print(type(e).__name__, e.name, "one device at a time" in str(e))
            print(s.capturing, other.capturing)
        g.destroy()
        other.synchronize()
        """
    )
    assert out.splitlines() == ["NotSupportedError CUDA_ERROR_NOT_SUPPORTED True", "True False"]


def test_a_synchronous_peer_copy_is_refused_where_a_capture_forbids_unsafe_calls() -> None:
    """docs/guide/capture.md: a peer copy without a stream waits for the legacy stream, an unsafe call, so a
    GLOBAL or THREAD_LOCAL capture refuses it before the driver (which would answer 900 and end the
    capture), in either direction; the capture goes on. A RELAXED capture allows it."""
    out = _run(
        """
        import cudacore as cc
        d0, d1, _ = cc.devices()
        a, b = d0.allocate(4096), d1.allocate(4096)
        s = d0.create_stream()
        for mode in ("global", "thread_local", "relaxed"):
            with s.capture(mode) as g:
                for dst, src in ((b, a), (a, b)):
                    try:
                        cc.device_to_device(dst, src)
                        print(mode, "copied")
                    except cc.CaptureError as e:
                        print(mode, e.name, "synchronous peer copy" in str(e))
                print(mode, s.capturing)
            g.destroy()
        a.close(); b.close(); s.close()
        """
    )
    assert out.splitlines() == [
        "global CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED True",
        "global CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED True",
        "global True",
        "thread_local CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED True",
        "thread_local CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED True",
        "thread_local True",
        "relaxed copied",
        "relaxed copied",
        "relaxed True",
    ]

"""Issue 30 (items 1-7, 14-18): objects that own driver memory or descriptors (SharedBuffer, ImportedBuffer,
ManagedBuffer, tiles, leases, IpcHandles) under misuse: several threads, DLPack exports, interrupts, graphs,
zombies, spawn workers, out of memory. Each test failed before the owner mechanism of cudacore._owner."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import cudacore as cc
from cudacore import _owner
from cudacore._native import core

from conftest import run_python

pytestmark = pytest.mark.sim


@pytest.fixture(autouse=True)
def _clean() -> object:
    yield
    gc.collect()
    cc.Device(0).release_cached_memory()


def _shared() -> int:
    return int(cc.Device(0).memory_stats()["shared_in_use"])


def test_a_view_opened_in_the_exporter_keeps_the_memory() -> None:
    """Item 1: the Buffer IpcHandle.open() returns in the exporting process outlived SharedBuffer.close(),
    and its writes landed in the next SharedBuffer given the same block."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096)
    with sb.export() as h:
        view = h.open()
    with pytest.raises(cc.IllegalStateError, match="in this process"):
        sb.close()
    assert not sb.closed
    view.copy_from(b"\x07" * 4096)
    out = bytearray(4096)
    sb.copy_to(out)
    assert out == b"\x07" * 4096
    view.close()
    sb.close()
    assert sb.closed


def test_close_refuses_a_live_dlpack_export_before_freeing() -> None:
    """Item 2: close() freed the memory first and only then refused (BufferError) for the live export."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096)
    ptr = sb.ptr
    capsule = sb.__dlpack__()
    before = _shared()
    with pytest.raises(BufferError):
        sb.close()
    assert not sb.closed and _shared() == before
    other = d.allocate_shareable(4096)  # the block is still sb's: not handed out again
    assert other.ptr != ptr
    other.close()
    del capsule
    sb.close()
    assert _shared() == before - 4096


def test_an_imported_buffer_refuses_a_live_dlpack_export_before_unmapping() -> None:
    """Item 2, for ImportedBuffer.close(): it unmapped the memory first and only then refused. The import
    here takes the path a second process takes (the handle names another live process as its exporter:
    fuzz_mix._foreign)."""
    import fuzz_mix

    d = cc.Device(0)
    before = _shared()
    sb = d.allocate_shareable(4096, kind="pool")
    h = sb.export()
    with fuzz_mix._foreign(cc, h) as other:
        imp = other.open()
    assert isinstance(imp, cc.ImportedBuffer)
    capsule = imp.__dlpack__()
    with pytest.raises(BufferError):
        imp.close()
    assert not imp.closed
    imp.copy_from(b"\x09" * 4096)  # still mapped: the bytes reach the exporter's memory
    out = bytearray(4096)
    sb.copy_to(out)
    assert out == b"\x09" * 4096
    with pytest.raises(cc.IllegalStateError):
        sb.close()  # still imported
    del capsule
    imp.close()
    h.close()
    sb.close()
    assert imp.closed and sb.closed and _shared() == before


def test_threads_closing_one_shared_buffer_free_it_once() -> None:
    """Item 5: threads closing one SharedBuffer at once freed it several times (untyped OSError,
    'mmap closed', another thread's new buffer losing its memory)."""
    d = cc.Device(0)
    before = _shared()
    for _ in range(20):
        sb = d.allocate_shareable(1 << 16)
        sb.export().close()  # a lease to release too
        barrier, errors = threading.Barrier(8), []

        def close(sb: cc.SharedBuffer = sb, barrier: threading.Barrier = barrier, errors: list = errors) -> None:
            barrier.wait()
            try:
                sb.close()
            except BaseException as e:  # noqa: BLE001 - any error is the failure
                errors.append(e)

        threads = [threading.Thread(target=close) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sb.closed
    assert _shared() == before


def test_concurrent_exports_share_one_lease() -> None:
    """Item 6: concurrent export() calls each made a lease; an importer of an orphaned lease was invisible
    to close()."""
    d = cc.Device(0)
    for _ in range(5):
        sb = d.allocate_shareable(4096)
        barrier, handles = threading.Barrier(8), []

        def export(sb: cc.SharedBuffer = sb, barrier: threading.Barrier = barrier, handles: list = handles) -> None:
            barrier.wait()
            handles.append(sb.export())

        threads = [threading.Thread(target=export) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({os.fstat(h.lease_fd).st_ino for h in handles}) == 1
        for h in handles:
            h.close()
        sb.close()


_IMPORTER = """
import json, sys
from cudacore import _ipc
meta, fds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
buf = _ipc._from_meta(meta, fds).open()
print("opened", flush=True)
"""


def test_a_zombie_importer_does_not_block_close() -> None:
    """Item 4: an importer killed (exited) but not yet reaped held the memory: close() said 'processes
    [pid] still hold this memory open'."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    with sb.export() as h:
        fds = h.fds()
        p = subprocess.Popen([sys.executable, "-c", _IMPORTER, json.dumps(h._meta()), json.dumps(fds)], pass_fds=fds,
                             stdout=subprocess.PIPE, env=env)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == b"opened\n"
        while not _zombie(p.pid):
            pass
        sb.close()  # the zombie holds nothing
        assert sb.closed
    finally:
        p.wait()


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def test_spawn_workers_leave_no_descriptors_behind() -> None:
    """Item 3: each spawn worker a SharedBuffer was pickled into left 2 duplicated descriptors in the
    exporter until it exited."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp, os
        import cudacore as cc

        def work(buf):
            buf.close()

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            sb = cc.Device(0).allocate_shareable(4096)
            counts = []
            for _ in range(5):  # the first starts multiprocessing's own helpers (the resource tracker)
                p = ctx.Process(target=work, args=(sb,))
                p.start()
                p.join()
                del p
                counts.append(len(os.listdir("/proc/self/fd")))
            print(counts[-1] - counts[0])
            sb.close()
        """
    )
    r = run_python(code, env={"CUDACORE_BACKEND": "sim", "CUDACORE_ALLOCATOR": "pool"}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) <= 0


@pytest.mark.parametrize("kind", ["pool", "ipc"])
def test_a_graph_keeps_shared_memory_alive(kind: str) -> None:
    """Item 14: a graph did not keep a SharedBuffer's memory alive; the next launch wrote into a new buffer
    (pool kind) or freed memory (ipc kind)."""
    d = cc.Device(0)
    s = d.create_stream()
    src = d.allocate(4096)
    sb = d.allocate_shareable(4096, kind=kind)
    ptr = sb.ptr
    with s.capture() as g:
        cc.device_to_device(sb, src, stream=s)
    sb.close()
    others = [d.allocate_shareable(4096, kind=kind) for _ in range(4)]
    assert ptr not in {o.ptr for o in others}, "the graph's memory was handed out again"
    for o in others:
        o.close()
    free = d.memory_info()[0]
    g.destroy()
    d.release_cached_memory()
    assert d.memory_info()[0] >= free + 4096
    src.close()
    s.close()


def test_a_graph_keeps_managed_memory_alive() -> None:
    """Item 14: a ManagedBuffer closed while a graph uses it was freed at once."""
    d = cc.Device(0)
    s = d.create_stream()
    src = d.allocate(4096)
    m = d.allocate_managed(4096)
    before = d.memory_stats()["managed_in_use"]
    with s.capture() as g:
        cc.device_to_device(m, src, stream=s)
    m.close()
    assert m.closed
    assert d.memory_stats()["managed_in_use"] == before, "freed while the graph uses it"
    g.destroy()
    assert d.memory_stats()["managed_in_use"] == before - 4096
    src.close()
    s.close()


_CLOSED_IN_CAPTURE = """
import sys
import cudacore as cc
kind, mode = sys.argv[1], sys.argv[2]
d = cc.Device(0)
s = d.create_stream()
src = d.allocate(4096)
src.copy_from(b"\\x07" * 4096)
m = d.allocate_managed(4096) if kind == "managed" else d.allocate_shareable(4096, kind=kind)
ptr = m.ptr
with s.capture(mode) as g:
    cc.device_to_device(m, src, stream=s)
    m.close()  # inside the capture that names it
if kind == "managed":
    held = d.memory_stats()["managed_in_use"] == 4096
else:  # not handed out again while the graph lives
    others = [d.allocate_shareable(4096, kind=kind) for _ in range(4)]
    held = ptr not in {o.ptr for o in others}
    for o in others:
        o.close()
g.launch(s)  # the simulator ends the process if the graph names freed memory, as the real driver crashes
s.synchronize()
g.destroy()
print(held, d.memory_stats()["managed_in_use"] + d.memory_stats()["shared_in_use"])
"""


@pytest.mark.parametrize("mode", ["global", "relaxed"])
@pytest.mark.parametrize("kind", ["managed", "pool", "ipc"])
def test_memory_closed_inside_the_capture_that_uses_it_is_kept_by_the_graph(kind: str, mode: str) -> None:
    """Found by the fuzzer's new mix (tests/fuzz_mix.py): a ManagedBuffer or SharedBuffer closed inside the
    capture that copies to it was freed when the capture ended, before its graph was among the memory's
    users, so the graph's instantiation named freed memory (the simulator ends the process there). The
    graph keeps it until destroyed, as it keeps a Buffer's."""
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(_CLOSED_IN_CAPTURE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
        env["CUDACORE_BACKEND"] = "sim"
        r = subprocess.run([sys.executable, str(script), kind, mode], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    held, after = r.stdout.split()
    assert (held, after) == ("True", "0"), "kept while the graph lived, freed at its destruction"


# -- interrupts -------------------------------------------------------------------------------------------


class _Interrupt:
    """Wraps a Go entry so that it raises KeyboardInterrupt after Go returned (as a Ctrl-C there does)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.real = getattr(core, name)
        monkeypatch.setattr(core, name, self)

    def __call__(self, *args: object) -> object:
        self.real(*args)
        raise KeyboardInterrupt


@pytest.mark.parametrize("entry", ["ManagedAllocate", "AllocateTiles", "ShareAllocate"])
def test_an_interrupt_after_an_allocation_loses_nothing(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Item 18: a Ctrl-C between allocate_managed/allocate_tiles/allocate_shareable's Go call and its
    Buffer leaked the memory for good."""
    d = cc.Device(0)
    gc.collect()
    before = d.memory_stats()
    _Interrupt(monkeypatch, entry)
    call = {"ManagedAllocate": lambda: d.allocate_managed(4096), "AllocateTiles": lambda: d.allocate_tiles(3, 4096),
            "ShareAllocate": lambda: d.allocate_shareable(4096)}[entry]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        call()
    gc.collect()
    after = d.memory_stats()
    for key in ("in_use", "managed_in_use", "shared_in_use"):
        assert after[key] == before[key], key


def test_an_interrupt_in_shared_close_never_frees_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 18: a Ctrl-C in SharedBuffer.close() after the free led to a second free, of the next
    SharedBuffer given the same block."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="ipc")
    _Interrupt(monkeypatch, "OwnedFree")
    with pytest.raises(KeyboardInterrupt):
        sb.close()
    monkeypatch.undo()
    nxt = d.allocate_shareable(4096, kind="ipc")
    nxt.copy_from(b"\x05" * 4096)
    sb.close()  # again, and then collected: neither frees nxt's memory
    del sb
    gc.collect()
    out = bytearray(4096)
    nxt.copy_to(out)
    assert out == b"\x05" * 4096
    assert _shared() >= 4096
    nxt.close()


def test_an_adopted_allocation_interrupted_after_its_buffers_frees_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """adopt(): Buffers made before an interrupt free their blocks by address; the token frees the rest,
    never those blocks again."""
    d = cc.Device(0)
    gc.collect()
    before = d.memory_stats()["in_use"]
    failures = d.memory_stats()["failures"]  # cumulative: earlier tests of the process may have counted some
    real = core.OwnedClaim

    def claim(token: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(core, "OwnedClaim", claim)
    with pytest.raises(KeyboardInterrupt):
        d.allocate_tiles(4, 8192)
    monkeypatch.setattr(core, "OwnedClaim", real)
    gc.collect()
    assert d.memory_stats()["in_use"] == before
    assert d.memory_stats()["failures"] == failures
    assert isinstance(_owner.Owner().token, int)


# -- out of memory ---------------------------------------------------------------------------------------

_SMALL = json.dumps([{"name": "small", "total_memory": 64 << 20}])


def _run(code: str, **env: str) -> list[str]:
    r = run_python(textwrap.dedent(code), env={"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": _SMALL, **env}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_every_out_of_memory_error_carries_a_verdict() -> None:
    """Item 15: allocate_managed, allocate_shareable (both kinds) and allocate_pinned raised
    OutOfMemoryError with cause None and the driver's raw message."""
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        keep = []
        for call in (lambda: d.allocate_managed(1 << 40), lambda: d.allocate_shareable(1 << 40, kind="pool"),
                     lambda: d.allocate_shareable(1 << 40, kind="ipc"),
                     lambda: keep.append(d.allocate(40 << 20)) or d.allocate_shareable(48 << 20, kind="ipc"),
                     lambda: d.allocate_pinned(1 << 20)):
            try:
                call()
            except cc.OutOfMemoryError as e:
                print(e.cause, str(e).split(":")[0])
        """,
        CUDACORE_SIM_FAULTS="cuMemHostAlloc:1:2,cuMemHostAlloc:2:2",
    )
    assert out == [
        "too_large the request is larger than the device",
        "too_large the request is larger than the device",
        "too_large the request is larger than the device",
        "exhausted memory exhausted by this process",
        "exhausted memory exhausted by this process",
    ]


def test_this_process_memory_outside_the_allocator_is_not_other_processes() -> None:
    """Item 16: the verdict blamed other processes for this process's own SharedBuffers and
    ManagedBuffers."""
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        keep = [d.allocate_shareable(20 << 20, kind="ipc"), d.allocate_managed(20 << 20)]
        try:
            d.allocate(40 << 20)
        except cc.OutOfMemoryError as e:
            print(e.cause, e.fields["outside"])
        """
    )
    assert out == ["exhausted " + str(40 << 20)]


def test_a_live_graphs_memory_is_this_process_memory_counted_once() -> None:
    """Item 16, a live graph's memory: graph memory a launched graph holds is this process's in the
    verdict, counted once: in ``in_use`` while its Buffer is open, in ``outside`` once the Buffer is closed
    and the graph keeps the memory. It was counted in both while the Buffer was open (the message gave 40
    MiB in use and 40 MiB outside, on a device with 44 MiB used)."""
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        s = d.create_stream()
        with s.capture() as g:
            kept = d.allocate(40 << 20, stream=s)  # graph memory the graph's launches make real
        g.launch(s)
        s.synchronize()
        for step in ("open", "closed"):
            try:
                d.allocate(40 << 20)
            except cc.OutOfMemoryError as e:
                print(step, e.cause, int(e.fields["in_use"]) >> 20, int(e.fields["outside"]) >> 20)
            kept.close()
        g.destroy()
        """
    )
    assert out == ["open exhausted 40 0", "closed exhausted 0 40"]


def test_memory_cached_for_one_path_goes_back_for_another() -> None:
    """Item 17: a closed SharedBuffer's block in the exportable pool made allocate fail (blaming other
    processes); a closed Buffer's cached block made allocate_shareable and allocate_managed fail."""
    out = _run(
        """
        import cudacore as cc
        d = cc.Device(0)
        d.allocate_shareable(40 << 20, kind="pool").close()
        with d.allocate(40 << 20):
            print("allocate")
        d.allocate(40 << 20).close()
        with d.allocate_shareable(40 << 20, kind="pool"), d.allocate(1 << 20):
            print("shareable pool")
        d.allocate(40 << 20).close()
        with d.allocate_shareable(40 << 20, kind="ipc"):
            print("shareable ipc")
        d.allocate(40 << 20).close()
        with d.allocate_managed(40 << 20):
            print("managed")
        """,
        CUDACORE_ALLOCATOR="pool",
    )
    assert out == ["allocate", "shareable pool", "shareable ipc", "managed"]


def test_an_owner_cut_short_in_its_init_is_collected_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the signal sweep (tests/signal_sweep.py): a KeyboardInterrupt inside an owner's __init__,
    before it had `closed`, made its collection raise AttributeError ("Exception ignored in __del__"), and
    the descriptors a Descriptors was given were never closed."""
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    bare = _owner.Owner.__new__(_owner.Owner)  # nothing set: as if interrupted at once
    del bare
    r, w = os.pipe()
    cut = _owner.Descriptors.__new__(_owner.Descriptors)
    cut.fds = [r]  # what Descriptors.__init__ sets first
    del cut
    gc.collect()
    assert seen == []
    with pytest.raises(OSError):
        os.fstat(r)  # closed by the collected owner
    os.close(w)

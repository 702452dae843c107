"""The direct path of the hot calls (cudacore/direct.go): graph launches and small pinned copies made from C
once cudacore has checked them, and everything that must still go through Go.

On the simulator the direct path calls the simulated driver with no check of cudacore's, as the real driver
takes it; a destroyed stream's handle ends the process there too, so a direct call that should have gone
through Go fails loudly. Whether a call went direct shows with an injected fault: a direct call that fails
falls back to the full path through Go, which makes the call again, so one fault on the next driver call
is absorbed on the direct path and raised on the full one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cudacore as cc
from cudacore import testing
from cudacore._native import fast

from conftest import run_python

FILL_PTX = Path(__file__).parent / "kernels" / "fill.ptx"


def _one_copy_graph(d: cc.Device, s: cc.Stream) -> tuple[cc.Graph, cc.Buffer, cc.PinnedBuffer]:
    buf = d.allocate(4096, stream=s)
    pinned = d.allocate_pinned(4096)
    with s.capture() as g:
        buf.copy_from(pinned, stream=s)
    return g, buf, pinned


@pytest.mark.sim
def test_a_launched_graph_hands_out_its_executable_graph(dev):
    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    assert g._exec == 0, "nothing to launch directly before the first launch"
    g.launch(s)
    assert g._exec != 0
    g.destroy()
    assert g._exec == 0
    with pytest.raises(cc.CUDAError) as ei:
        g.launch(s)
    assert ei.value.name == "CUDACORE_ERROR_CLOSED"
    buf.close(), pinned.close(), s.close()


@pytest.mark.sim
def test_a_graph_whose_allocation_outlives_it_always_launches_through_go(dev):
    s = dev.create_stream()
    with s.capture() as g:
        kept = dev.allocate(256, stream=s)  # graph memory the graph does not free
    g.launch(s)
    s.synchronize()
    assert g._exec == 0  # each launch changes the allocation's state, which Go keeps
    kept.close()
    g.destroy()
    with s.capture() as g2:
        tmp = dev.allocate(256, stream=s)
        tmp.close()  # allocated and freed inside: every launch is complete in itself
    g2.launch(s)
    assert g2._exec != 0
    g2.launch(s)
    s.synchronize()
    g2.destroy()
    s.close()


@pytest.mark.sim
@pytest.mark.parametrize("direct", [True, False])
def test_one_failing_launch_is_retried_through_go(dev, direct):
    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(s)
    if not direct:
        g._exec = 0  # as if the direct path were off
    testing.inject_fault("cuGraphLaunch", 1, "CUDA_ERROR_UNKNOWN")
    if direct:
        g.launch(s)  # the direct call fails, the full path launches
    else:
        with pytest.raises(cc.CUDAError, match="CUDA_ERROR_UNKNOWN|unknown"):
            g.launch(s)
    # Two failures in a row: the direct attempt and the full path's, which reports it.
    testing.inject_faults("cuGraphLaunch:1:CUDA_ERROR_UNKNOWN,cuGraphLaunch:2:CUDA_ERROR_UNKNOWN")
    with pytest.raises(cc.CUDAError):
        g.launch(s)
    testing.clear_faults()
    s.synchronize()
    g.destroy(), buf.close(), pinned.close(), s.close()


@pytest.mark.sim
def test_what_takes_the_full_path(dev):
    """Only an open Stream this process owns takes the direct path, and only while nothing captures."""
    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(s)
    for target in (cc.Stream.legacy(dev), s.handle, None):
        testing.inject_fault("cuGraphLaunch", 1, "CUDA_ERROR_UNKNOWN")
        with pytest.raises(cc.CUDAError):
            g.launch(target)
        testing.clear_faults()
    other = dev.create_stream()
    with other.capture(mode="relaxed") as g2:
        testing.inject_fault("cuGraphLaunch", 1, "CUDA_ERROR_UNKNOWN")
        with pytest.raises(cc.CUDAError):
            g.launch(s)  # another stream captures: Go's capture rules and audit apply
        testing.clear_faults()
        g.launch(s)
    assert g2.escaped == 1 and g2.escapes[0].startswith("graph_launch")
    s.synchronize()
    for x in (g, g2, buf, pinned, s, other):
        x.close()


@pytest.mark.sim
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_an_end_capture_refused_on_another_thread_keeps_the_capture_listed(dev, mode):
    """end_capture on a thread other than the one that began a THREAD_LOCAL or GLOBAL capture is refused
    and the capture goes on: it stays registered in Go, whose snapshot keeps the direct path off, so nothing
    takes it past Go's capture rules meanwhile."""
    import threading

    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(s)
    s.synchronize()
    other = dev.create_stream()
    began, finish, out = threading.Event(), threading.Event(), {}

    def owner():
        other.begin_capture(mode)
        began.set()
        finish.wait()
        out["graph"] = other.end_capture()

    t = threading.Thread(target=owner)
    t.start()
    began.wait()
    try:
        with pytest.raises(cc.CUDAError) as ei:
            other.end_capture()
        assert ei.value.name == "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"
        assert other.capturing
        assert fast.capturing(), "still registered: the direct path stays off"
        if mode == "thread_local":
            # Through Go (one fault is raised, not absorbed by a direct attempt), which applies the
            # capture's rules, then again with nothing injected.
            testing.inject_fault("cuGraphLaunch", 1, "CUDA_ERROR_UNKNOWN")
            with pytest.raises(cc.CUDAError):
                g.launch(s)
            testing.clear_faults()
            g.launch(s)
    finally:
        finish.set()
        t.join()
    g2 = out["graph"]
    assert not fast.capturing()
    assert g2.escaped == 0, "this thread's launches are no work of the capturing thread's"
    s.synchronize()
    for x in (g, g2, buf, pinned, s, other):
        x.close()


@pytest.mark.sim
def test_launch_on_a_closed_stream_never_reaches_the_driver():
    """The simulator ends the process on a destroyed stream's handle, as the real driver crashes: the
    closed stream must be refused before any driver call, direct or not."""
    r = run_python(
        """
import cudacore as cc
d = cc.Device(0)
s = d.create_stream()
buf, pinned = d.allocate(4096, stream=s), d.allocate_pinned(4096)
with s.capture() as g:
    buf.copy_from(pinned, stream=s)
g.launch(s)
s.synchronize()
s.close()
for call in (lambda: g.launch(s), lambda: buf.copy_from(pinned, stream=s), lambda: buf.copy_to(pinned, stream=s)):
    try:
        call()
    except cc.CUDAError as e:
        print(e.name)
""",
        env={"CUDACORE_BACKEND": "sim"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["CUDACORE_ERROR_CLOSED"] * 3


@pytest.mark.sim
@pytest.mark.parametrize("n", [4096, 1 << 20])  # direct at any size (through Go only up to 64 KiB)
def test_pinned_copies_go_direct_and_move_the_bytes(dev, n):
    s = dev.create_stream()
    buf = dev.allocate(n, stream=s)
    src, out = dev.allocate_pinned(n), dev.allocate_pinned(n)
    np.frombuffer(src, dtype=np.uint8)[:] = np.arange(n) % 251
    testing.inject_fault("cuMemcpyHtoDAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
    buf.copy_from(src, stream=s)  # direct; its failure is absorbed by the full path's retry
    testing.inject_fault("cuMemcpyDtoHAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
    buf.copy_to(out, stream=s)
    s.synchronize()
    assert bytes(out) == bytes(src)
    testing.clear_faults()
    for x in (buf, src, out, s):
        x.close()


@pytest.mark.sim
@pytest.mark.parametrize(("n", "direct"), [(1, True), (64 << 10, True), ((64 << 10) + 1, False)])
def test_small_pageable_copies_to_the_device_go_direct(dev, n, direct):
    """Up to 64 KiB (with the GIL held) a pageable host-to-device copy that the stream manager would hand to
    the driver's own pageable copy goes direct: a fault on it is absorbed. Larger ones, and device-to-host
    copies, go through Go: the fault is raised."""
    s = dev.create_stream()
    buf = dev.allocate(n, stream=s)
    src = (np.arange(n) % 251).astype(np.uint8)
    testing.inject_fault("cuMemcpyHtoDAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
    if direct:
        buf.copy_from(src, stream=s)
    else:
        with pytest.raises(cc.CUDAError, match="CUDA_ERROR_UNKNOWN"):
            buf.copy_from(src, stream=s)
        buf.copy_from(src, stream=s)
    out = np.zeros(n, dtype=np.uint8)
    testing.inject_fault("cuMemcpyDtoHAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
    with pytest.raises(cc.CUDAError, match="CUDA_ERROR_UNKNOWN"):
        buf.copy_to(out, stream=s)
    buf.copy_to(out, stream=s)
    s.synchronize()
    assert np.array_equal(out, src)
    testing.clear_faults()
    buf.close()
    s.close()


@pytest.mark.sim
def test_staging_every_pageable_copy_keeps_them_off_the_direct_path():
    r = run_python(
        """
import numpy as np
import cudacore as cc
from cudacore import testing
d = cc.Device(0)
s = d.create_stream()
buf = d.allocate(4096, stream=s)
testing.inject_fault("cuMemcpyHtoDAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
try:
    buf.copy_from(np.ones(4096, np.uint8), stream=s)
    print("absorbed")
except cc.CUDAError:
    print("raised")
""",
        env={"CUDACORE_BACKEND": "sim", "CUDACORE_PAGEABLE_DIRECT_MAX": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "raised"


@pytest.mark.sim
@pytest.mark.parametrize("name", ["CUDACORE_RECYCLE", "CUDACORE_DIRECT"])
def test_an_on_off_setting_that_is_neither_is_refused_by_name(name):
    r = run_python(
        """
import cudacore as cc
try:
    cc.Device(0)
    print("accepted")
except cc.InvalidValueError as e:
    print(e)
""",
        env={"CUDACORE_BACKEND": "sim", name: "maybe"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(f'{name}="maybe": must be 0 (off) or 1 (on, the default)')


@pytest.mark.sim
@pytest.mark.parametrize(("value", "want"), [("0", "off"), ("1", "on"), ("", "on"), ("maybe", "InvalidValueError")])
def test_the_direct_setting_is_read_by_go_when_the_device_opens(value, want):
    # Go publishes the device's facts in the snapshot that C reads (docs/contributing/design.md, "The snapshot"):
    # CUDACORE_DIRECT decides one of them, and a value that is neither 0 nor 1 is refused by name.
    r = run_python(
        """
import cudacore as cc
from cudacore._native import fast
try:
    cc.Device(0)
    print("on" if fast.direct_enabled(0) else "off")
except cc.InvalidValueError as e:
    assert "CUDACORE_DIRECT" in str(e), e
    print("InvalidValueError")
""",
        env={"CUDACORE_BACKEND": "sim", "CUDACORE_DIRECT": value},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


@pytest.mark.sim
def test_the_direct_path_can_be_turned_off():
    r = run_python(
        """
import cudacore as cc
from cudacore import testing
d = cc.Device(0)
s = d.create_stream()
buf, pinned = d.allocate(4096, stream=s), d.allocate_pinned(4096)
testing.inject_fault("cuMemcpyHtoDAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
try:
    buf.copy_from(pinned, stream=s)
    print("absorbed")
except cc.CUDAError:
    print("raised")
""",
        env={"CUDACORE_BACKEND": "sim", "CUDACORE_DIRECT": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "raised"


def test_direct_doors_take_nothing_they_cannot_check(dev):
    """The direct doors read what they check from the objects themselves, with the GIL held: anything that is
    not an open owned Stream with a launched graph or kernel is not taken (False), and Go decides."""
    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    assert fast.graph_launch_direct(g, s) is False  # not launched yet: no executable graph
    g.launch(s)
    assert g._exec != 0
    for stream in (None, 0, s.handle, cc.Stream.legacy(dev), object()):
        assert fast.graph_launch_direct(g, stream) is False, stream
    assert fast.graph_launch_direct(object(), s) is False
    assert fast.graph_launch_direct(g, s) is True
    s.synchronize()
    with pytest.raises(TypeError):
        fast.graph_launch_direct(g)
    g.destroy(), buf.close(), pinned.close(), s.close()


@pytest.mark.gpu
def test_gpu_direct_graph_launches_and_copies_move_the_bytes(dev):
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    src, out = dev.allocate_pinned(4096), dev.allocate_pinned(4096)
    with s.capture() as g:
        buf.copy_from(src, stream=s)
    host = np.frombuffer(src, dtype=np.uint8)
    for i in range(50):  # the first launch goes through Go, the others direct; each reads src as it is
        host[:] = i
        g.launch(s)
        s.synchronize()
        buf.copy_to(out, stream=s)  # direct too
        s.synchronize()
        assert bytes(out) == bytes([i]) * 4096
    assert g._exec != 0
    del host  # a view of src: src cannot close while it lives
    g.destroy()
    s.close()
    with pytest.raises(cc.CUDAError) as ei:
        buf.copy_from(src, stream=s)
    assert ei.value.name == "CUDACORE_ERROR_CLOSED"
    for x in (buf, src, out):
        x.close()


@pytest.mark.gpu
def test_gpu_direct_kernel_launches_and_what_stops_them(dev):
    m = dev.load_module(FILL_PTX)
    k = m.function("fill")
    s = dev.create_stream()
    a = dev.allocate(4096, stream=s)
    out = np.zeros(1024, dtype=np.uint32)
    a.copy_from(out, stream=s)  # new device memory holds whatever its last user left there
    k.launch(4, 256, (a, 7, 1000), stream=s)  # through Go, which hands out the function handle
    assert k._direct != 0
    for v in range(8, 40):
        k.launch(4, 256, (a, v, 1000), stream=s)  # direct
    a.copy_to(out, stream=s)
    s.synchronize()
    assert (out[:1000] == 39).all() and (out[1000:] == 0).all()
    # The driver refuses a block beyond the device: the full path explains it.
    with pytest.raises(cc.InvalidValueError, match="above the device's maximum"):
        k.launch(1, 2048, (a, 1, 1000), stream=s)
    b = dev.allocate(64, stream=s)
    b.close()
    with pytest.raises(cc.CUDAError) as ei:
        k.launch(1, 1, (b, 1, 1), stream=s)
    assert ei.value.name == "CUDACORE_ERROR_CLOSED"
    s.synchronize()
    m.unload()
    with pytest.raises(cc.CUDAError) as ei:
        k.launch(1, 1, (a, 1, 1), stream=s)
    assert ei.value.name == "CUDACORE_ERROR_CLOSED"
    s.close()
    a.close()


# -- queries and waits ---------------------------------------------------------------------------------------


def _waitables(dev: cc.Device) -> tuple[cc.Stream, cc.Event]:
    s = dev.create_stream()
    return s, s.record(cc.Event(dev, timing=False))


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["stream", "event"])
def test_queries_and_waits_take_the_direct_path(dev, kind):
    """Stream/Event.query and synchronize query from C: a driver failure there is absorbed by the full path,
    which queries again through Go (and would raise the same fault had it come first)."""
    s, e = _waitables(dev)
    obj, entry = (s, "cuStreamQuery") if kind == "stream" else (e, "cuEventQuery")
    for method in (obj.query, obj.synchronize):
        testing.inject_fault(entry, 1, "CUDA_ERROR_UNKNOWN")
        assert method() in (True, None)
        assert testing.clear_faults() == 0, "the direct call met the fault"
    testing.inject_fault(entry, 1, "CUDA_ERROR_NOT_READY")
    assert obj.query() is False, "the direct answer: still running"
    assert obj.query() is True
    e.close(), s.close()


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["stream", "event"])
def test_a_wait_longer_than_the_spin_goes_on_in_go(dev, kind, monkeypatch):
    """The direct wait spins only briefly with the GIL held; work still running after that is waited for
    through Go, in GIL-released slices (the Python method), until it is done."""
    s, e = _waitables(dev)
    obj, entry, name = (s, "cuStreamQuery", "_stream_wait") if kind == "stream" else (e, "cuEventQuery", "_event_wait")
    slices = []
    go_wait = getattr(cc._stream, name)
    monkeypatch.setattr(cc._stream, name, lambda *a: slices.append(a) or go_wait(*a))
    testing.inject_faults(",".join(f"{entry}:{i}:CUDA_ERROR_NOT_READY" for i in range(1, 2001)))
    obj.synchronize()
    assert slices, "the wait went on through Go"
    assert testing.clear_faults() == 0, "every answer 'not ready' was seen before the wait ended"
    e.close(), s.close()


@pytest.mark.sim
def test_queries_and_waits_go_through_go_when_they_cannot_be_direct(dev):
    """Anything C cannot vouch for goes through Go, which checks and reports: a stream this process does not
    own, a closed stream or event, and any query while a stream captures."""
    s, e = _waitables(dev)
    legacy = cc.Stream.legacy(dev)
    testing.inject_fault("cuStreamQuery", 1, "CUDA_ERROR_UNKNOWN")
    with pytest.raises(cc.CUDAError):
        legacy.query()
    other = dev.create_stream()
    with other.capture(mode="thread_local"):
        for obj, entry in ((s, "cuStreamQuery"), (e, "cuEventQuery")):
            testing.inject_fault(entry, 1, "CUDA_ERROR_UNKNOWN")
            with pytest.raises(cc.CUDAError):
                obj.query()
    e.close(), s.close(), other.close()
    for obj in (s, e):
        with pytest.raises(cc.CUDAError) as ei:
            obj.synchronize()
        assert ei.value.name == "CUDACORE_ERROR_CLOSED"


def test_hot_methods_keep_their_python_signatures_and_docs(dev):
    import inspect

    for cls, name, params in ((cc.Stream, "synchronize", ["self"]), (cc.Stream, "query", ["self"]),
                              (cc.Event, "synchronize", ["self"]), (cc.Event, "query", ["self"]),
                              (cc.Graph, "launch", ["self", "stream"]),
                              (cc.Kernel, "launch", ["self", "grid", "block", "args", "shared_mem", "stream"])):  # fmt: skip
        method = getattr(cls, name)
        assert list(inspect.signature(method).parameters) == params, (cls, name)
        assert method.__doc__ and method.__doc__.split()[0][0].isupper(), (cls, name)
    s = dev.create_stream()
    with pytest.raises(TypeError):
        s.synchronize(1)  # type: ignore[call-arg]
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(stream=s)  # keywords go to the Python method
    g.launch(s)
    s.synchronize()
    g.destroy(), buf.close(), pinned.close(), s.close()


def _copy_goes_direct(d: cc.Device, s: cc.Stream) -> bool:
    """Whether a small pinned copy to ordinary device memory takes the direct path: one fault on it is
    absorbed there (the full path retries) and raised through Go."""
    buf, pinned = d.allocate(4096, stream=s), d.allocate_pinned(4096)
    testing.inject_fault("cuMemcpyHtoDAsync_v2", 1, "CUDA_ERROR_UNKNOWN")
    try:
        buf.copy_from(pinned, stream=s)
    except cc.CUDAError:
        return False
    finally:
        testing.clear_faults()
        s.synchronize()
        buf.close()
        pinned.close()
    return True


def _fate_launched(d, s):
    with s.capture() as g:
        buf = d.allocate(4096, stream=s)
    assert not _copy_goes_direct(d, s), "graph memory pending: copies go through Go"
    g.launch(s)
    s.synchronize()
    buf.close()
    g.destroy()


def _fate_destroyed(d, s):
    with s.capture() as g:
        buf = d.allocate(4096, stream=s)
    assert not _copy_goes_direct(d, s)
    g.destroy()
    buf.close()


def _fate_orphan(d, s):
    with s.capture() as g:
        buf = d.allocate(4096, stream=s)
    buf.close()
    g.launch(s)
    s.synchronize()
    g.destroy()


def _fate_aborted(d, s):
    with pytest.raises(ZeroDivisionError), s.capture():
        d.allocate(4096, stream=s)
        1 / 0  # noqa: B018


def _fate_collected(d, s):
    import gc

    with s.capture() as g:
        buf = d.allocate(4096, stream=s)
    assert not _copy_goes_direct(d, s)
    del g
    gc.collect()
    buf.close()


def _fate_tiles(d, s):
    with s.capture() as g:
        tiles = d.allocate_tiles(4, 4096, stream=s)
    assert not _copy_goes_direct(d, s)
    g.launch(s)
    s.synchronize()
    for t in tiles:
        t.close()
    g.destroy()


@pytest.mark.sim
@pytest.mark.parametrize(
    "fate", [_fate_launched, _fate_destroyed, _fate_orphan, _fate_aborted, _fate_collected, _fate_tiles]
)
def test_the_direct_path_comes_back_once_no_graph_memory_is_pending(dev, fate):
    """While graph memory that no launch made real exists, copies leave the direct path (it cannot tell
    which addresses that memory covers); once none is left, whatever its fate, they take it again."""
    s = dev.create_stream()
    assert _copy_goes_direct(dev, s), "nothing pending: direct"
    fate(dev, s)
    assert _copy_goes_direct(dev, s), "the count went back to zero"
    s.close()

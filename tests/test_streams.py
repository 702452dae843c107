"""Streams, events, copies and graph capture (issue 4).

Unmarked tests run on the simulator by default and on the GPU with CUDACORE_BACKEND=cuda; ``sim`` tests
need the simulator (fault injection, simulated device shapes); ``gpu`` tests need the real driver.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import closing

import numpy as np
import pytest

import cudacore as cc
from cudacore import _api, _handles, _stream, testing
from cudacore._native import fast

from conftest import objects, rand, run_python

N = 64 << 10
MODES = ["global", "thread_local", "relaxed"]


# -- streams and events -------------------------------------------------------------------------------


def test_stream_properties_and_priority_range(dev):
    least, greatest = cc.Stream.priority_range(dev)
    assert greatest <= least
    # Issue 31: a priority outside the range is refused, naming it, where the driver would clamp it.
    for bad in (greatest - 1, least + 1, 99):
        with pytest.raises(cc.InvalidValueError, match=rf"priority {bad} is outside device 0's range, {greatest} "):
            dev.create_stream(priority=bad)
    with closing(dev.create_stream(non_blocking=False, priority=greatest)) as s:
        assert s.priority == greatest
        assert not s.non_blocking
        assert s.device == dev
        assert isinstance(s.handle, int) and s.handle > 2
        assert s.query() is True
        s.synchronize()
        assert not s.capturing and s.capture_mode is None
    with closing(dev.create_stream(priority=least)) as s:
        assert s.priority == least and s.non_blocking
    assert s.closed
    s.close()  # idempotent
    with pytest.raises(cc.InvalidHandleError):
        s.synchronize()


def test_no_leaks(dev):
    before = objects()
    for _ in range(20):
        s = dev.create_stream()
        e = s.record()
        with s.capture() as g:
            pass
        g.destroy()
        e.close()
        s.close()
    assert objects() == before


def test_events(dev):
    s = dev.create_stream()
    a = s.record()
    time.sleep(0.002)
    b = s.record()
    b.synchronize()
    assert b.query()
    assert a.elapsed_time(b) > 0
    other = dev.create_stream()
    other.wait(b)
    other.synchronize()
    nt = cc.Event(dev, timing=False).record(s)
    with pytest.raises(cc.InvalidHandleError):
        a.elapsed_time(nt)
    nt.close()
    with pytest.raises(cc.InvalidHandleError):
        nt.record(s)


def test_device_synchronize(dev):
    dev.synchronize()


# -- copies ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", ["pinned", "numpy", "bytearray", "bytes"])
def test_copy_round_trip(dev, stream, kind):
    n = 9 * (1 << 20) + 123  # more than two 4 MiB staging buffers
    s = dev.create_stream() if stream else None
    data = rand(n, 1)
    if kind == "pinned":
        src = dev.allocate_pinned(n)
        src.numpy()[:] = data
        dst = dev.allocate_pinned(n)
        out = dst.numpy
    elif kind == "numpy":
        src, dst = data.copy(), np.zeros(n, np.uint8)
        out = lambda: dst
    elif kind == "bytearray":
        src, dst = bytearray(data.tobytes()), bytearray(n)
        out = lambda: np.frombuffer(dst, np.uint8)
    else:
        src, dst = data.tobytes(), bytearray(n)
        out = lambda: np.frombuffer(dst, np.uint8)
    with dev.allocate(n, stream=s) as a, dev.allocate(n, stream=s) as b:
        a.copy_from(src, stream=s)
        cc.device_to_device(b, a, stream=s)
        b.copy_to(dst, stream=s)
        if s is not None:
            s.synchronize()
        assert np.array_equal(out(), data)


def test_pageable_async_copy_is_staged(dev):
    """The host memory of a pageable asynchronous copy may be reused as soon as the call returns."""
    s = dev.create_stream()
    host = bytearray(rand(N, 2).tobytes())
    want = bytes(host)
    with dev.allocate(N, stream=s) as buf:
        buf.copy_from(host, stream=s)
        host[:] = bytes(N)  # overwritten before the stream runs (on a GPU): the staged data is what lands
        out = np.zeros(N, np.uint8)
        buf.copy_to(out, stream=s)
        s.synchronize()
        assert out.tobytes() == want


@pytest.mark.parametrize("n", [4096, 9 * (1 << 20) + 5], ids=["4KiB", "9MiB"])
def test_pageable_async_copy_to_host_has_arrived_when_it_returns(dev, n):
    """docs/guide/memory.md: an asynchronous copy into pageable memory returns once the data has arrived in it,
    whatever its size (it goes through the staging buffers)."""
    s = dev.create_stream()
    data = rand(n, 3)
    with dev.allocate(n, stream=s) as buf:
        buf.copy_from(data, stream=s)  # queued on s: the copy out must follow it
        out = np.zeros(n, np.uint8)
        buf.copy_to(out, stream=s)
        assert np.array_equal(out, data)  # no synchronize
    s.close()


def test_copy_bad_input(dev):
    s = dev.create_stream()
    buf = dev.allocate(4096)
    with pytest.raises(cc.InvalidValueError, match="the destination holds 100 bytes and the buffer 4096"):
        buf.copy_to(bytearray(100))
    with pytest.raises(cc.InvalidValueError, match="the source holds 8192 bytes and the buffer 4096"):
        buf.copy_from(bytes(8192))
    with pytest.raises(cc.InvalidValueError, match="read-only"):
        buf.copy_to(bytes(4096))
    with pytest.raises(cc.InvalidValueError, match="read-only"):
        ro = np.zeros(4096, np.uint8)
        ro.flags.writeable = False
        buf.copy_to(ro)
    with pytest.raises(cc.InvalidValueError, match="contiguous"):
        buf.copy_from(np.zeros(8192, np.uint8)[::2])
    with pytest.raises(TypeError):
        buf.copy_from(12345)
    buf.close()
    with pytest.raises(cc.InvalidHandleError):
        buf.copy_from(bytes(4096), stream=s)
    with pytest.raises(cc.InvalidHandleError):
        cc.device_to_device(buf, buf)


@pytest.mark.sim
def test_copy_device_mismatch():
    devices = json.dumps([{"name": "a", "total_memory": 1 << 30}, {"name": "b", "total_memory": 1 << 30}])
    code = """
import cudacore as cc
d0, d1 = cc.Device(0), cc.Device(1)
s1 = d1.create_stream()
buf = d0.allocate(4096)
for call in (lambda: buf.copy_from(bytes(4096), stream=s1), lambda: buf.copy_to(bytearray(4096), stream=s1),
             lambda: buf.copy_from(bytes(4096), stream=s1.handle)):
    try:
        call()
    except cc.InvalidValueError as e:
        print("refused:", e)
    else:
        print("ACCEPTED")
"""
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": devices})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("refused:") == 3, r.stdout
    assert "device 1" in r.stdout


# -- capture ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_capture_replay_1000(dev, mode):
    """Capture pinned H2D + D2D + pinned D2H once; replay 1000 times with fresh host data."""
    s = dev.create_stream(non_blocking=False)
    inp, outp = dev.allocate_pinned(N), dev.allocate_pinned(N)
    a, b = dev.allocate(N, stream=s), dev.allocate(N, stream=s)
    src, dst = inp.numpy(), outp.numpy()
    with s.capture(mode=mode) as graph:
        a.copy_from(inp, stream=s)
        cc.device_to_device(b, a, stream=s)
        b.copy_to(outp, stream=s)
    assert graph.node_count == 3
    graph.upload(s)
    rng = np.random.default_rng(7)
    for i in range(1000):
        want = rng.integers(0, 256, N, dtype=np.uint8)
        src[:] = want
        graph.launch(s)
        s.synchronize()
        assert np.array_equal(dst, want), f"launch {i}"
    graph.destroy()
    a.close()
    b.close()
    del src, dst
    inp.close()
    outp.close()


def test_graph_update(dev):
    s = dev.create_stream()
    pins = [dev.allocate_pinned(N) for _ in range(4)]
    buf = dev.allocate(N, stream=s)

    def capture(src, dst):
        with s.capture() as g:
            buf.copy_from(src, stream=s)
            buf.copy_to(dst, stream=s)
        return g

    g1, g2 = capture(pins[0], pins[1]), capture(pins[2], pins[3])
    pins[2].numpy()[:] = rand(N, 3)
    g1.update(g2)  # g1 now moves pins[2] -> pins[3]
    g1.launch(s)
    s.synchronize()
    assert np.array_equal(pins[3].numpy(), pins[2].numpy())
    g2.destroy()
    with pytest.raises(cc.InvalidHandleError):
        g1.update(g2)
    g1.close()


def test_graph_debug_dot(dev, tmp_path):
    s = dev.create_stream()
    pin_in, pin_out = dev.allocate_pinned(N), dev.allocate_pinned(N)
    buf = dev.allocate(N, stream=s)
    with s.capture() as g:
        with pytest.raises(cc.IllegalStateError, match="before its capture ends"):
            g.debug_dot(tmp_path / "pending.dot")
        buf.copy_from(pin_in, stream=s)
        buf.copy_to(pin_out, stream=s)
    plain, verbose = tmp_path / "plain.dot", tmp_path / "verbose.dot"
    g.debug_dot(plain)
    g.debug_dot(str(verbose), verbose=True)
    text, detail = plain.read_text(), verbose.read_text()
    assert text.lstrip().startswith("digraph"), text[:200]
    assert len(detail) > len(text)
    if os.environ["CUDACORE_BACKEND"] == "sim":  # the simulator's own rendering: one node per copy, in order
        assert [ln.split(": ", 1)[1].split('"')[0] for ln in text.splitlines() if "label=" in ln] == ["MEMCPY HtoD", "MEMCPY DtoH"]
        assert f"{buf.ptr:#x}" in detail
        assert detail.count(f"\\n{N} bytes") == 2, detail  # a host copy's size too
    g.launch(s)  # written before instantiation, and after it too
    s.synchronize()
    g.debug_dot(plain)
    assert plain.read_text() == text

    with pytest.raises(cc.InvalidValueError, match="does not exist"):
        g.debug_dot(tmp_path / "no" / "such" / "folder.dot")
    with pytest.raises(cc.InvalidValueError, match="not a file name"):
        g.debug_dot("")
    with pytest.raises(cc.InvalidValueError, match="folder, not a file"):
        g.debug_dot(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(cc.InvalidValueError, match="pipe or socket, not a file"):
        g.debug_dot(tmp_path / "fifo")  # no reader: the write would block for good
    with pytest.raises(cc.InvalidValueError, match="not valid UTF-8"):  # not a bare UnicodeEncodeError
        g.debug_dot(bytes(tmp_path / "x") + b"\xff.dot")
    with pytest.raises(cc.InvalidValueError, match="is not a folder"):
        g.debug_dot(plain / "under-a-file.dot")
    with pytest.raises(cc.InvalidValueError, match="cannot be looked up: .*too long"):
        g.debug_dot(tmp_path.joinpath(*["d" * 200] * 30, "x.dot"))
    g.debug_dot(bytes(verbose))  # a bytes path is a path
    assert verbose.read_text() == text
    with pytest.raises(TypeError, match="as path"):
        g.debug_dot(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="as verbose"):
        g.debug_dot(plain, verbose="yes")  # type: ignore[arg-type]
    g.destroy()
    with pytest.raises(cc.InvalidHandleError) as closed:
        g.debug_dot(plain)
    assert closed.value.name == "CUDACORE_ERROR_CLOSED"
    for x in (buf, pin_in, pin_out, s):
        x.close()


def _blocking_capture(dev, mode):
    s = dev.create_stream(non_blocking=False)
    other = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    return s, other, buf, pinned


def _captured_event_sync(dev, s, other, buf, pinned):
    e = s.record()
    e.synchronize()


def _first_launch(dev, s, other, buf, pinned):
    """A graph's first launch instantiates it, an unsafe call (the GPU fuzzer: the driver answered 900
    and the capture was gone)."""
    with other.capture(mode="relaxed") as g:
        buf.copy_from(pinned, stream=other)
    try:
        g.launch(other)
        other.synchronize()
    finally:
        g.destroy()


ILLEGAL = {
    # name: (operation, expected code, expected code in relaxed mode (None: allowed))
    "sync copy_to": (lambda d, s, o, b, p: b.copy_to(bytearray(4096)), 906, 906),
    "sync copy_to pinned": (lambda d, s, o, b, p: b.copy_to(p), 906, 906),
    "sync copy_from": (lambda d, s, o, b, p: b.copy_from(bytes(4096)), 906, 906),
    "sync device_to_device": (lambda d, s, o, b, p: cc.device_to_device(b, b), 906, 906),
    "pageable async copy_from": (lambda d, s, o, b, p: b.copy_from(bytes(4096), stream=s), 900, 900),
    "pageable async copy_to": (lambda d, s, o, b, p: b.copy_to(bytearray(4096), stream=s), 900, 900),
    "synchronize the capturing stream": (lambda d, s, o, b, p: s.synchronize(), 900, 900),
    "query the capturing stream": (lambda d, s, o, b, p: s.query(), 900, 900),
    "synchronize another stream": (lambda d, s, o, b, p: o.synchronize(), 900, None),
    "synchronize the device": (lambda d, s, o, b, p: d.synchronize(), 900, 900),
    "allocate on the legacy stream": (lambda d, s, o, b, p: d.allocate(1024), 906, 906),
    "wait on an event recorded in the capture": (_captured_event_sync, 907, 907),
    "record on the legacy stream": (lambda d, s, o, b, p: cc.Event(d).record(None), 906, 906),
    "first launch of another graph": (_first_launch, 900, None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ILLEGAL))
def test_illegal_during_capture_leaves_stream_usable(dev, mode, name):
    op, code, relaxed_code = ILLEGAL[name]
    want = relaxed_code if mode == "relaxed" else code
    s, other, buf, pinned = _blocking_capture(dev, mode)
    s.begin_capture(mode)
    try:
        if want is None:
            op(dev, s, other, buf, pinned)
        else:
            with pytest.raises(cc.CaptureError) as info:
                op(dev, s, other, buf, pinned)
            err = info.value
            assert err.code == want, err
            assert err.op.startswith("cudacore."), err.op
            if "pageable" not in name:  # (the driver would accept a pageable copy and replay a stale pointer)
                assert f"error {want}" in str(err)  # the message names the driver's code
        assert s.capturing, "refused before the driver: the capture goes on"
    finally:
        graph = s.end_capture()
    graph.destroy()
    # The stream and the device work again.
    data = rand(4096, 5)
    pinned.numpy()[:] = data
    buf.copy_from(pinned, stream=s)
    out = np.zeros(4096, np.uint8)
    buf.copy_to(out, stream=s)
    s.synchronize()
    assert np.array_equal(out, data)
    dev.synchronize()
    assert objects()["captures"] == 0


def test_906_message_names_operation_and_fix(dev):
    s = dev.create_stream(non_blocking=False)
    buf = dev.allocate(4096, stream=s)
    with pytest.raises(cc.CaptureError) as info, s.capture():
        buf.copy_to(bytearray(4096))
    msg = str(info.value)
    assert info.value.code == 906
    assert info.value.name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
    assert info.value.op == "cudacore.copy_to"
    assert "synchronous device-to-host copy" in msg
    assert "copy_to(pinned, stream=<the capturing stream>)" in msg
    assert not s.capturing
    s.synchronize()


def test_capture_block_that_raises_is_discarded(dev):
    s = dev.create_stream()
    with pytest.raises(ZeroDivisionError), s.capture() as g:
        1 / 0  # noqa: B018
    assert not s.capturing
    with pytest.raises(cc.CUDAError, match="capture it again") as info:  # a dead graph, not a pending one
        g.launch(s)
    assert info.value.name == "CUDACORE_ERROR_CLOSED"
    s.synchronize()


def test_nonblocking_capture_allows_sync_copies_elsewhere(dev):
    """Only blocking captures conflict with the legacy stream."""
    s = dev.create_stream(non_blocking=True)
    buf = dev.allocate(4096)
    with s.capture(mode="relaxed"):
        buf.copy_from(bytes(range(256)) * 16)
        out = bytearray(4096)
        buf.copy_to(out)
    assert bytes(out) == bytes(range(256)) * 16


def test_two_captures_at_once(dev):
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(seed: int) -> None:
        try:
            s = dev.create_stream()
            inp, outp = dev.allocate_pinned(N), dev.allocate_pinned(N)
            buf = dev.allocate(N, stream=s)
            barrier.wait()
            with s.capture(mode="thread_local") as g:
                barrier.wait()  # both capture now
                buf.copy_from(inp, stream=s)
                buf.copy_to(outp, stream=s)
            for i in range(50):
                want = rand(N, seed * 1000 + i)
                inp.numpy()[:] = want
                g.launch(s)
                s.synchronize()
                assert np.array_equal(outp.numpy(), want)
            g.destroy()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_capture_ends_only_on_its_thread(dev, mode):
    """end_capture and abort_capture from another thread are refused with 908 and the capture goes on,
    at the driver too: the thread that began it can still end it, and the stream works afterwards."""
    s = dev.create_stream()
    s.begin_capture(mode)
    errors: list[BaseException] = []

    def other() -> None:
        for end in (s.end_capture, s.abort_capture):
            try:
                end()
            except cc.CaptureError as exc:
                errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert [e.code for e in errors] == [908, 908], errors
    assert s.capturing
    assert fast.capturing(), "still registered: the direct path stays off"
    s.abort_capture()
    assert not s.capturing
    assert not fast.capturing()
    s.synchronize()
    assert objects()["captures"] == 0


def test_capture_bad_input(dev):
    for legacy in (cc.Stream.legacy(dev), cc.Stream.per_thread(dev)):
        with pytest.raises(cc.CaptureError, match="create_stream"):
            legacy.begin_capture()
    s = dev.create_stream()
    with pytest.raises(cc.IllegalStateError, match="not capturing"):
        s.end_capture()
    with pytest.raises(cc.InvalidValueError):
        s.begin_capture("bogus")
    s.begin_capture("relaxed")
    with pytest.raises(cc.IllegalStateError, match="already capturing"):
        s.begin_capture("relaxed")
    g = s.end_capture()
    g.destroy()
    g.destroy()  # idempotent
    with pytest.raises(cc.InvalidHandleError, match="destroyed"):
        g.launch(s)
    with pytest.raises(cc.InvalidHandleError):
        g.upload(s)
    # A stream destroyed while it captures ends the capture.
    s2 = dev.create_stream(non_blocking=False)
    s2.begin_capture("global")
    s2.close()
    assert objects()["captures"] == 0
    dev.synchronize()


def test_allocations_in_capture_become_nodes(dev):
    if dev.allocation_strategy != "pool":
        pytest.skip("needs the pool strategy")
    s = dev.create_stream()
    with s.capture() as g:
        a = dev.allocate(1 << 20, stream=s)
        b = dev.allocate(3 << 20, stream=s)
        cc.device_to_device(b, a, stream=s)
        a.close()
        b.close()
    assert g.memory_held == 4 << 20
    assert g.allocations == 2
    assert g.node_count >= 3  # alloc nodes, the copy, free nodes
    g.launch(s)
    s.synchronize()
    g.destroy()


@pytest.mark.sim
def test_sync_strategy_refuses_allocation_in_capture():
    devices = json.dumps([{"name": "no-pools", "total_memory": 1 << 30, "memory_pools_supported": False}])
    code = """
import cudacore as cc
d = cc.Device(0)
assert d.allocation_strategy == "sync", d.allocation_strategy
s = d.create_stream()
for mode in ("global", "thread_local", "relaxed"):
    s.begin_capture(mode)
    try:
        d.allocate(4096, stream=s)
    except cc.CaptureError as e:
        print(mode, e.code, e)
    else:
        print(mode, "ACCEPTED")
    g = s.end_capture()
    g.destroy()
buf = d.allocate(4096, stream=s)  # fine outside capture
print("after", buf.size)
"""
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": devices})
    assert r.returncode == 0, r.stderr
    assert "ACCEPTED" not in r.stdout
    assert r.stdout.count("allocate before capture") == 3, r.stdout
    assert "after 4096" in r.stdout


@pytest.mark.sim
@pytest.mark.parametrize("code", [900, 901, 906])
def test_driver_capture_error_ends_capture(code):
    """Where the driver fails anyway, cudacore ends the capture and reports the first failing operation."""
    script = """
import cudacore as cc
d = cc.Device(0)
s = d.create_stream()
a, b = d.allocate(4096, stream=s), d.allocate(4096, stream=s)
s.begin_capture("thread_local")
try:
    cc.device_to_device(b, a, stream=s)  # the first cuMemcpyDtoDAsync fails: injected
except cc.CaptureError as e:
    print("op error", e.code, e.op, "|", e)
print("capturing", s.capturing)
try:
    s.end_capture()
except cc.CaptureError as e:
    print("end error", e.code, "|", e)
cc.device_to_device(b, a, stream=s)
s.synchronize()
print("usable")
"""
    r = run_python(script, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_FAULTS": f"cuMemcpyDtoDAsync_v2:1:{code}"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"op error {code} cudacore.copy" in out, out
    assert "ended the capture" in out
    assert "capturing False" in out
    assert f"end error {code}" in out and "first failing operation, copy" in out
    assert "usable" in out


# -- interruptible waits -----------------------------------------------------------------------------------


def _still_running(entry: str) -> None:
    """Make the next queries answer that the work still runs: the direct path's short GIL-held spin (C)
    then hands the wait to the interruptible slices."""
    testing.inject_faults(",".join(f"{entry}:{i}:CUDA_ERROR_NOT_READY" for i in range(1, 5001)))


@pytest.mark.sim
def test_synchronize_is_interruptible(dev, monkeypatch):
    """Ctrl-C lands between the GIL-released wait slices of a synchronize that does not finish."""
    calls = {"n": 0}

    def never_done(*args):
        calls["n"] += 1
        time.sleep(0.01)  # a slice: on a GPU this is a GIL-released wait in Go
        return False

    monkeypatch.setattr(_stream, "_stream_query", lambda *a: False)
    monkeypatch.setattr(_stream, "_stream_wait", never_done)
    s = dev.create_stream()
    _still_running("cuStreamQuery")
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            s.synchronize()
    finally:
        timer.cancel()
        testing.clear_faults()
    assert time.monotonic() - start < 5
    assert calls["n"] >= 2


@pytest.mark.sim
def test_event_synchronize_is_interruptible(dev, monkeypatch):
    monkeypatch.setattr(_stream, "_event_query", lambda *a: False)
    monkeypatch.setattr(_stream, "_event_wait", lambda *a: time.sleep(0.01) or False)
    e = cc.Event(dev)
    _still_running("cuEventQuery")
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            e.synchronize()
    finally:
        timer.cancel()
        testing.clear_faults()


def test_wait_slice_returns(dev):
    s = dev.create_stream()
    assert _api.call(_api.core.StreamWait, dev.device_id, s.handle, 50) is True


# -- GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_long_synchronize_interruptible(dev):
    """A real stream kept busy by a large pageable copy chain: synchronize stops on Ctrl-C."""
    s = dev.create_stream()
    n = 512 << 20
    a, b = dev.allocate(n, stream=s), dev.allocate(n, stream=s)
    for _ in range(200):  # ~200 x 512 MiB of device copies: a few hundred milliseconds at least
        cc.device_to_device(b, a, stream=s)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    interrupted = False
    try:
        s.synchronize()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        timer.cancel()
    s.synchronize()
    a.close()
    b.close()
    assert interrupted or s.query()


@pytest.mark.gpu
def test_gpu_906_text(dev):
    """The CaptureError a user sees for a synchronous device-to-host copy during capture (issue 4's closing note)."""
    s = dev.create_stream(non_blocking=False)
    buf = dev.allocate(4096, stream=s)
    with pytest.raises(cc.CaptureError) as info, s.capture():
        buf.copy_to(bytearray(4096))
    print("\n906 CaptureError:", repr(info.value))
    assert info.value.code == 906
    out = bytearray(4096)
    buf.copy_to(out)  # the stream and the legacy stream work again
    s.synchronize()


@pytest.mark.parametrize("mode", MODES)
def test_frees_during_capture_wait_for_its_end(dev, mode):
    """Buffers closed (or garbage-collected) while a stream captures are freed when the capture ends,
    instead of invalidating it (cuMemFreeHost and cuMemFree are unsafe calls; legacy-stream frees are 906)."""
    s = dev.create_stream(non_blocking=False)
    pinned = dev.allocate_pinned(1 << 20)
    buf = dev.allocate(1 << 20)
    before = dev.memory_stats()["pinned_in_use"]
    s.begin_capture(mode)
    pinned.close()
    buf.close()
    assert s.capturing
    graph = s.end_capture()  # not invalidated
    graph.destroy()
    assert dev.memory_stats()["pinned_in_use"] == before - (1 << 20)


def test_a_stream_waits_for_another_stream(dev) -> None:
    # Stream.wait takes a Stream as cuda.core's does: an event recorded on it now, waited for, and closed.
    from conftest import objects

    a, b = dev.create_stream(), dev.create_stream()
    before = objects()
    a.wait(b)
    a.wait(cc.Stream.legacy(dev))
    a.wait(a)  # its own work is in order already
    assert objects() == before, "the marker event is gone"
    for bad in (None, 3, True):
        with pytest.raises(TypeError, match="an Event or a stream"):
            a.wait(bad)
    b.close()
    with pytest.raises(cc.InvalidHandleError):
        a.wait(b)
    assert objects()["events"] == before["events"], "no marker event is left behind by a refusal either"
    a.close()


def test_current_streams_live_in_each_threads_state(dev):
    # The one copy of a thread's current streams is the dict in its thread state (fast.thread_streams),
    # which `with stream:` changes and the C hot paths read: per thread, emptied as blocks end.
    s = dev.create_stream()
    mine = fast.thread_streams()
    assert fast.thread_streams() is mine and dev.ordinal not in mine
    seen: dict[str, object] = {}

    def other() -> None:
        theirs = fast.thread_streams()
        seen["distinct"] = theirs is not mine
        seen["empty while mine is set"] = dev.ordinal not in theirs
        with s:
            seen["theirs set"] = theirs.get(dev.ordinal) is s
            seen["handle"] = _handles.stream_handle(None, dev.ordinal)

    with s:
        assert mine[dev.ordinal] is s
        t = threading.Thread(target=other)
        t.start()
        t.join()
        inner = dev.create_stream()
        with inner:
            assert mine[dev.ordinal] is inner
        assert mine[dev.ordinal] is s
        inner.close()
    assert dev.ordinal not in mine
    assert seen == {"distinct": True, "empty while mine is set": True, "theirs set": True, "handle": s.handle}
    s.close()

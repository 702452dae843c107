"""The one door into Go (cudacore/native/door.c): the fork check before everything else, argument conversion
that names the function and the argument, the closed-object code, and DLPack stream ordering by event
under the capture and stream-lifetime rules.

Unmarked tests run on the simulator by default and on the GPU with CUDACORE_BACKEND=cuda; ``sim`` tests need
the simulator (fault injection).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import cudacore as cc
from cudacore import testing
from cudacore._native import fast
from cudacore.interop import _DLManagedTensor

from conftest import ROOT, run_python

MiB = 1 << 20
FILL_PTX = ROOT / "tests" / "kernels" / "fill.ptx"

_api = ctypes.pythonapi


def _capsule_tensor(capsule: object) -> ctypes.Structure:
    assert _api.PyCapsule_IsValid(capsule, b"dltensor") == 1
    return _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor


def _assert_all_closed(cases: list[tuple[str, Callable[[], object]]]) -> None:
    """Every case raises a CUDAError with code -3 (CUDACORE_ERROR_CLOSED); all are tried, all misses listed."""
    problems = []
    for what, fn in cases:
        try:
            fn()
        except cc.CUDAError as exc:
            if (exc.code, exc.name) != (-3, "CUDACORE_ERROR_CLOSED"):
                problems.append(f"{what}: got code {exc.code} ({exc.name}, {type(exc).__name__}): {exc}")
        except Exception as exc:  # noqa: BLE001 - reported below
            problems.append(f"{what}: not a CUDAError: {type(exc).__name__}: {exc}")
        else:
            problems.append(f"{what}: no error")
    assert not problems, "\n".join(problems)


# -- 1. fork x every public call ----------------------------------------------------------------------

_FORK_PROBE = r"""
import gc, json, os, sys, threading, time, faulthandler, traceback
import numpy as np
import cudacore as cc
from cudacore import interop, testing

FILL_PTX = sys.argv[1] if len(sys.argv) > 1 else __FILL__
ROUNDS = 5
CHILD_TIMEOUT = 20.0

dev = cc.Device(0)
s = dev.create_stream()
other = dev.create_stream()
ev = cc.Event(dev)
ev.record(s)
buf = dev.allocate(4096, stream=s)
buf2 = dev.allocate(4096, stream=s)
buf_to_close = dev.allocate(256, stream=s)
dl_buf = dev.allocate(1024, stream=s)
pinned = dev.allocate_pinned(4096)
pinned_to_close = dev.allocate_pinned(256)
pinned.numpy()[:] = 7
with s.capture() as g:
    buf.copy_from(pinned, stream=s)
g.launch(s)
s.synchronize()
try:
    mod = dev.load_module(FILL_PTX)
    kernel = mod.function("fill")
except cc.CUDAError as exc:  # no module on this backend: the launch is then left out
    mod = kernel = None
    print("no module:", exc, file=sys.stderr)

stop = threading.Event()
thread_errors = []
counts = [0, 0, 0, 0]

def busy(i):
    ts = dev.create_stream()
    try:
        while not stop.is_set():
            b = dev.allocate(512 + i, stream=ts)
            dev.memory_info()
            ts.query()
            b.close()
            e = cc.Event(dev, timing=False)
            e.record(ts)
            e.query()
            e.close()
            ts.synchronize()
            counts[i] += 1
    except BaseException as exc:  # reported by the parent
        thread_errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
    finally:
        ts.close()

threads = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(4)]
for t in threads:
    t.start()
time.sleep(0.05)


def child(wfd):
    faulthandler.dump_traceback_later(CHILD_TIMEOUT - 2, exit=True)  # a C thread: works when Go hangs
    results = {}

    def expect(name, fn):
        try:
            fn()
        except BaseException as exc:
            ok = (
                isinstance(exc, cc.IllegalStateError)
                and getattr(exc, "code", None) == -2
                and getattr(exc, "name", None) == "CUDACORE_ERROR_FORKED"
                and "spawn" in str(exc)
            )
            results[name] = "ok" if ok else f"{type(exc).__name__} code={getattr(exc, 'code', None)}: {exc}"
        else:
            results[name] = "no error"

    d0 = cc.Device(0)
    expect("Device(0).allocate", lambda: d0.allocate(64))
    expect("Device.allocate(stream)", lambda: dev.allocate(64, stream=s))
    expect("Device.allocate_pinned", lambda: dev.allocate_pinned(64))
    expect("Device.allocate_tiles", lambda: dev.allocate_tiles(2, 1024))
    expect("Device.memory_stats", lambda: dev.memory_stats())
    expect("Device.memory_info", lambda: dev.memory_info())
    expect("Device.synchronize", lambda: dev.synchronize())
    expect("Device.release_cached_memory", lambda: dev.release_cached_memory())
    expect("Device.create_stream", lambda: dev.create_stream())
    expect("Event()", lambda: cc.Event(dev))
    expect("Stream.synchronize", lambda: s.synchronize())
    expect("Stream.query", lambda: s.query())
    expect("Stream.wait", lambda: s.wait(ev))
    expect("Stream.capturing", lambda: s.capturing)
    expect("Stream.begin_capture", lambda: s.begin_capture())
    expect("Stream.close", lambda: other.close())
    expect("Event.record", lambda: ev.record(s))
    expect("Event.query", lambda: ev.query())
    expect("Event.synchronize", lambda: ev.synchronize())
    expect("Graph.launch", lambda: g.launch(s))
    expect("Graph.upload", lambda: g.upload(s))
    expect("Graph.node_count", lambda: g.node_count)
    expect("Graph.debug_dot", lambda: g.debug_dot(os.devnull))
    expect("Buffer.copy_from(pinned, stream)", lambda: buf.copy_from(pinned, stream=s))
    expect("Buffer.copy_from(bytes)", lambda: buf.copy_from(b"x" * 64, nbytes=64))
    expect("Buffer.copy_to(pinned, stream)", lambda: buf.copy_to(pinned, stream=s))
    expect("Buffer.copy_to(bytearray)", lambda: buf.copy_to(bytearray(4096)))
    expect("device_to_device(stream)", lambda: cc.device_to_device(buf2, buf, stream=s))
    expect("device_to_device(sync)", lambda: cc.device_to_device(buf2, buf))
    expect("Buffer.close", lambda: buf_to_close.close())
    expect("PinnedBuffer.close", lambda: pinned_to_close.close())
    expect("Buffer.__dlpack__", lambda: dl_buf.__dlpack__(stream=s.handle))
    expect("Buffer.__dlpack__(-1)", lambda: dl_buf.__dlpack__(stream=-1))
    expect("Device.load_module", lambda: dev.load_module(FILL_PTX))
    if kernel is not None:
        expect("Kernel.launch", lambda: kernel.launch(1, 1, (buf, 7, 16), stream=s))
        expect("Module.function", lambda: mod.function("fill_f32"))
        expect("Module.unload", lambda: mod.unload())
    expect("testing.inject_faults", lambda: testing.inject_faults("cuMemAllocFromPoolAsync:1:CUDA_ERROR_OUT_OF_MEMORY"))
    expect("testing.clear_faults", lambda: testing.clear_faults())
    expect("testing.fail_allocations", lambda: testing.fail_allocations())
    expect("interop.last_error", lambda: interop.last_error())
    # What the child holds is dropped: destructors must not enter Go, crash or hang.
    try:
        os.write(wfd, json.dumps(results).encode() + b"\n")
    except BaseException:
        os._exit(5)
    g_ = globals()
    for name in ("buf", "buf2", "buf_to_close", "dl_buf", "pinned", "pinned_to_close", "g", "ev", "s", "other",
                 "kernel", "mod", "dev"):
        g_.pop(name, None)
    del d0
    gc.collect()
    os.write(wfd, b"dropped\n")
    os.close(wfd)
    os._exit(0)


report = {"rounds": [], "parent_errors": []}
for round_ in range(ROUNDS):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(w)
        except BaseException:
            traceback.print_exc()
        os._exit(6)
    os.close(w)
    deadline = time.monotonic() + CHILD_TIMEOUT
    status = None
    while time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.01)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        exit_code = "hang"
    else:
        exit_code = os.waitstatus_to_exitcode(status)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    lines = data.decode().splitlines()
    results = json.loads(lines[0]) if lines else None
    report["rounds"].append({"exit": exit_code, "results": results, "dropped": "dropped" in lines})
    # The parent keeps working after every fork.
    try:
        pinned.numpy()[:] = round_ + 1
        g.launch(s)
        host = bytearray(4096)
        buf.copy_to(host, stream=s)
        s.synchronize()
        assert host == bytes([round_ + 1]) * 4096, "the graph's copy did not run in the parent"
        cap = dl_buf.__dlpack__(stream=other.handle)
        del cap
        ev.record(s)
        ev.synchronize()
        dev.memory_stats()
    except BaseException as exc:
        report["parent_errors"].append(f"round {round_}: {type(exc).__name__}: {exc}")

stop.set()
for t in threads:
    t.join(10)
report["threads_alive"] = sum(t.is_alive() for t in threads)
report["thread_errors"] = thread_errors
report["thread_iterations"] = counts
try:
    buf_to_close.close()
    pinned_to_close.close()
    buf.close(); buf2.close(); dl_buf.close(); pinned.close(); g.destroy(); ev.close()
    if mod is not None:
        mod.unload()
    s.close(); other.close()
except BaseException as exc:
    report["parent_errors"].append(f"cleanup: {type(exc).__name__}: {exc}")
print("REPORT " + json.dumps(report))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_forked_child_every_public_call_is_refused_and_never_hangs() -> None:
    code = _FORK_PROBE.replace("__FILL__", repr(str(FILL_PTX)))
    r = run_python(code, {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}, timeout=180)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")]
    assert r.returncode == 0 and lines, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    report = json.loads(lines[-1][len("REPORT ") :])
    problems: list[str] = []
    for i, rnd in enumerate(report["rounds"]):
        if rnd["exit"] != 0:
            problems.append(f"fork {i}: child exit {rnd['exit']} (hang = killed after 20 s)")
        if rnd["results"] is None:
            problems.append(f"fork {i}: the child reported nothing")
            continue
        if not rnd["dropped"]:
            problems.append(f"fork {i}: the child did not finish dropping its objects")
        problems.extend(f"fork {i}: {op}: {res}" for op, res in rnd["results"].items() if res != "ok")
    problems.extend(report["parent_errors"])
    problems.extend(report["thread_errors"])
    if report["threads_alive"]:
        problems.append(f"{report['threads_alive']} busy threads did not stop")
    assert len(report["rounds"]) == 5
    assert all(n > 0 for n in report["thread_iterations"]), report["thread_iterations"]
    assert not problems, "\n".join(problems) + f"\nstderr:\n{r.stderr[-3000:]}"
    # Every public operation was probed (the kernel ones only where a module loads).
    assert {
        "Device(0).allocate",
        "Graph.launch",
        "Buffer.__dlpack__",
        "interop.last_error",
        "PinnedBuffer.close",
    } <= set(report["rounds"][0]["results"])


# -- 2. DLPack during a capture -----------------------------------------------------------------------


@pytest.mark.parametrize("consumer", ["third", "legacy", "per_thread", "capturing"])
@pytest.mark.parametrize("buffer_on", ["other", "capturing"])
def test_dlpack_during_global_capture_never_breaks_the_capture(dev, consumer, buffer_on) -> None:
    """__dlpack__ while another stream captures in GLOBAL mode: ordering by event must either work without
    invalidating the capture, or be refused with a CaptureError; the capture then ends normally."""
    if dev.allocation_strategy != "pool" and buffer_on == "capturing":
        pytest.skip("needs the pool strategy (stream-ordered allocation)")
    a = dev.create_stream()
    b = dev.create_stream()
    c = dev.create_stream()
    pinned = dev.allocate_pinned(4096)
    dst = dev.allocate(4096, stream=b)
    buf = dev.allocate(4096, stream=a if buffer_on == "other" else b)
    b.synchronize()
    a.synchronize()
    handle = {"third": c.handle, "legacy": 1, "per_thread": 2, "capturing": b.handle}[consumer]
    outcome = None
    wrong: BaseException | None = None
    with b.capture(mode="global") as g:
        dst.copy_from(pinned, stream=b)
        try:
            cap = buf.__dlpack__(stream=handle)
        except cc.CaptureError as exc:
            outcome = f"refused: {exc}"
        except cc.CUDAError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            wrong = exc
        else:
            outcome = "exported"
            assert _capsule_tensor(cap).data == buf.ptr
            del cap
        still_capturing = b.capturing
        dst.copy_from(pinned, stream=b)
    assert wrong is None, (
        f"__dlpack__ in a global capture must succeed or raise CaptureError; it raised {outcome}"
    )
    assert still_capturing, f"the capture was ended inside the block ({outcome})"
    assert not b.capturing
    assert not c.capturing, "the consumer stream was left joined into the capture"
    assert g.node_count >= 2, outcome
    pinned.numpy()[:] = 9
    g.launch(b)
    b.synchronize()
    out = bytearray(4096)
    dst.copy_to(out)
    assert out == b"\x09" * 4096
    gc.collect()
    for x in (buf, dst, pinned):
        x.close()
    g.destroy()
    for st in (a, b, c):
        st.close()


@pytest.mark.sim
def test_dlpack_stream_minus_one_orders_nothing(dev) -> None:
    """stream=-1 asks for no ordering: no event is recorded and no stream waits, even where either would
    fail (injected driver faults, a capture in progress on the buffer's stream)."""
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    s.synchronize()
    testing.inject_faults("cuEventRecord:1:CUDA_ERROR_UNKNOWN,cuStreamWaitEvent:1:CUDA_ERROR_UNKNOWN")
    try:
        cap = buf.__dlpack__(stream=-1)
        assert _capsule_tensor(cap).data == buf.ptr
        del cap
    finally:
        testing.clear_faults()
    with s.capture(mode="global") as g:
        cap = buf.__dlpack__(stream=-1)
        del cap
        assert s.capturing
    assert g.node_count == 0
    g.destroy()
    gc.collect()
    buf.close()
    s.close()


# -- 3. DLPack after its stream is closed ---------------------------------------------------------------


@pytest.mark.parametrize("consumer", [1, 2, "stream"])
def test_dlpack_after_the_buffers_stream_is_closed(dev, consumer) -> None:
    s = dev.create_stream()
    other = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    ptr = buf.ptr
    s.close()
    handle = other.handle if consumer == "stream" else consumer
    refs = sys.getrefcount(buf)
    cap = buf.__dlpack__(stream=handle)
    t = _capsule_tensor(cap)
    assert t.data == ptr and t.shape[0] == 4096
    assert sys.getrefcount(buf) == refs + 1
    with pytest.raises(BufferError, match="DLPack export"):
        buf.close()
    del cap, t
    gc.collect()
    assert sys.getrefcount(buf) == refs  # the deleter ran
    buf.close()
    assert buf.closed
    other.synchronize()
    other.close()
    dev.release_cached_memory()


def test_dlpack_after_the_buffers_stream_is_closed_in_a_fresh_process() -> None:
    """The same in a process of its own, so that a crash (a dead stream handed to the driver) shows as a
    failed exit rather than taking the test run down."""
    code = (
        "import gc, cudacore as cc\n"
        "d = cc.Device(0)\n"
        "s = d.create_stream()\n"
        "b = d.allocate(1 << 16, stream=s)\n"
        "s.close()\n"
        "other = d.create_stream()\n"
        "for h in (1, 2, other.handle):\n"
        "    cap = b.__dlpack__(stream=h)\n"
        "    del cap\n"
        "    gc.collect()\n"
        "b.close()\n"
        "print('ok')\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr[-3000:]}"
    assert r.stdout.strip() == "ok"


# -- 4. tiles inside a capture -----------------------------------------------------------------------------


def test_tiles_allocated_in_capture_count_in_the_graph(dev) -> None:
    if dev.allocation_strategy != "pool":
        pytest.skip("needs the pool strategy")
    s = dev.create_stream()
    with s.capture() as g:
        tiles = dev.allocate_tiles(4, MiB, stream=s)
        assert len(tiles) == 4
        for t in tiles:
            t.close()
    assert (g.allocations, g.memory_held) == (4, 4 * MiB), (
        f"allocate_tiles in a capture: graph reports {g.allocations} allocations, {g.memory_held} bytes held"
    )
    g.launch(s)
    s.synchronize()
    g.destroy()
    s.close()


# -- 5. closed objects: one code ------------------------------------------------------------------------


def test_closed_buffer(dev) -> None:
    buf = dev.allocate(64)
    buf.close()
    _assert_all_closed(
        [
            ("Buffer.ptr", lambda: buf.ptr),
            ("Buffer.__dlpack__", lambda: buf.__dlpack__()),
            ("Buffer.copy_from", lambda: buf.copy_from(b"x" * 64)),
            ("Buffer.copy_to", lambda: buf.copy_to(bytearray(64))),
        ]
    )


def test_closed_pinned_buffer(dev) -> None:
    h = dev.allocate_pinned(64)
    h.close()
    _assert_all_closed(
        [("memoryview(PinnedBuffer)", lambda: memoryview(h)), ("PinnedBuffer.ptr", lambda: h.ptr)]
    )


def test_closed_event(dev) -> None:
    ev = cc.Event(dev)
    ev.close()
    s = dev.create_stream()
    _assert_all_closed(
        [
            ("Event.record", lambda: ev.record(s)),
            ("Event.query", lambda: ev.query()),
            ("Event.synchronize", lambda: ev.synchronize()),
            ("Stream.wait(closed event)", lambda: s.wait(ev)),
        ]
    )
    s.close()


def test_destroyed_graph(dev) -> None:
    s = dev.create_stream()
    pinned = dev.allocate_pinned(256)
    buf = dev.allocate(256)
    with s.capture() as g:
        buf.copy_from(pinned, stream=s)
    g.destroy()
    _assert_all_closed(
        [
            ("Graph.launch", lambda: g.launch(s)),
            ("Graph.launch(None)", lambda: g.launch()),
            ("Graph.upload", lambda: g.upload(s)),
            ("Graph.node_count", lambda: g.node_count),
        ]
    )
    buf.close()
    pinned.close()
    s.close()


def test_closed_stream(dev) -> None:
    s = dev.create_stream()
    s.close()
    _assert_all_closed(
        [
            ("Stream.query", lambda: s.query()),
            ("Stream.synchronize", lambda: s.synchronize()),
            ("Device.allocate(stream=closed)", lambda: dev.allocate(64, stream=s)),
            ("Event.record(closed stream)", lambda: cc.Event(dev).record(s)),
            ("Stream.wait", lambda: s.wait(cc.Event(dev))),
            ("Stream.capturing", lambda: s.capturing),
            ("Stream.begin_capture", lambda: s.begin_capture()),
        ]
    )


def test_unloaded_modules_kernel(dev) -> None:
    m = dev.load_module(FILL_PTX)
    k = m.function("fill")
    buf = dev.allocate(64)
    m.unload()
    _assert_all_closed(
        [
            ("Kernel.launch", lambda: k.launch(1, 1, (buf, 7, 16))),
            ("Module.function", lambda: m.function("fill_f32")),
        ]
    )
    buf.close()


# -- 6. argument overflow -----------------------------------------------------------------------------


def _assert_invalid_argument(exc: BaseException, *names: str) -> None:
    assert not isinstance(exc, OverflowError), f"a bare OverflowError: {exc}"
    assert isinstance(exc, cc.InvalidValueError) and isinstance(exc, ValueError)
    assert any(n in str(exc) for n in names), f"the message names none of {names}: {exc}"


@pytest.mark.parametrize("big", [2**63, 2**64])
def test_overflowing_ints_are_invalid_values_naming_the_argument(dev, big) -> None:
    s = dev.create_stream()
    pinned = dev.allocate_pinned(256)
    buf = dev.allocate(256)
    with s.capture() as g:
        buf.copy_from(pinned, stream=s)
    ev = cc.Event(dev)
    m = dev.load_module(FILL_PTX)
    k = m.function("fill")
    cases = [
        ("Graph.launch(raw int)", lambda: g.launch(big), ("stream",)),
        ("Graph.upload(raw int)", lambda: g.upload(big), ("stream",)),
        ("Event.record(stream=big)", lambda: ev.record(stream=big), ("stream",)),
        ("Buffer.copy_from(stream=big)", lambda: buf.copy_from(pinned, stream=big), ("stream",)),
        ("Buffer.copy_to(stream=big)", lambda: buf.copy_to(pinned, stream=big), ("stream",)),
        ("copy nbytes=big", lambda: cc._copy.host_to_device(buf, pinned, s, nbytes=big), ("nbytes", "copy")),
        ("Device.allocate(big)", lambda: dev.allocate(big), ("size", "nbytes")),
        ("Device.allocate(stream=big)", lambda: dev.allocate(64, stream=big), ("stream",)),
        ("Device.allocate_pinned(big)", lambda: dev.allocate_pinned(big), ("size", "nbytes")),
        ("Device.allocate_tiles(big)", lambda: dev.allocate_tiles(2, big), ("tile_size", "size")),
        (
            "Kernel.launch grid",
            lambda: k.launch(grid=(big, 1, 1), block=1, args=(buf, 7, 16)),
            ("grid", "gx"),
        ),
        ("Kernel.launch stream", lambda: k.launch(1, 1, (buf, 7, 16), stream=big), ("stream",)),
        ("__dlpack__(stream=big)", lambda: buf.__dlpack__(stream=big), ("stream",)),
        # Cold entries (cudacore._api.call around gopy functions) pass the same guard.
        ("Device.create_stream(priority=big)", lambda: dev.create_stream(priority=big), ("priority",)),
        ("_api.call(core.Noop, big)", lambda: cc._api.call(cc._api.core.Noop, big), ("Noop", "x")),
    ]
    problems = []
    for what, fn, names in cases:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            try:
                _assert_invalid_argument(exc, *names)
            except AssertionError as bad:
                problems.append(f"{what}: {type(exc).__name__}: {exc} ({bad})")
        else:
            problems.append(f"{what}: no error")
    g.destroy()
    m.unload()
    ev.close()
    buf.close()
    pinned.close()
    s.close()
    assert not problems, "\n".join(problems)


# -- 7. arrays of Python objects --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [None, "stream"])
def test_object_arrays_are_refused_and_left_intact(dev, stream) -> None:
    s = dev.create_stream()
    st = s if stream == "stream" else None
    buf = dev.allocate(64)
    payload = ["a", object()]
    arr = np.array([1, 2], dtype=object)
    arr2 = np.array(payload, dtype=object)
    with pytest.raises(cc.InvalidValueError):
        buf.copy_to(arr, stream=st)
    assert arr[0] == 1 and arr[1] == 2 and arr.tolist() == [1, 2]
    with pytest.raises(cc.InvalidValueError):
        buf.copy_from(arr, stream=st)
    assert arr.tolist() == [1, 2]
    with pytest.raises(cc.InvalidValueError):
        buf.copy_to(arr2, stream=st)
    assert arr2[0] == "a" and arr2[1] is payload[1]
    gc.collect()
    assert repr(arr2)  # the elements are still live objects
    buf.close()
    s.close()


# -- the hot case of Buffer.copy_from / copy_to runs in C; every other call takes the general path ----------


@contextmanager
def _only_the_c_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test if Buffer's general copy path (the Python _copy_from / _copy_to) runs in the block."""

    def general(*args: object, **kwargs: object) -> None:
        raise AssertionError("the general path ran for the hot case")

    with monkeypatch.context() as m:
        m.setattr(cc.Buffer, "_copy_from", general)
        m.setattr(cc.Buffer, "_copy_to", general)
        yield


def test_pinned_copies_on_a_stream_take_the_c_path_and_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    d = cc.Device(0)
    s = d.create_stream()
    src, dst = d.allocate_pinned(4096), d.allocate_pinned(4096)
    buf = d.allocate(4096, stream=s)
    try:
        src.numpy()[:] = np.arange(4096, dtype=np.uint32).astype(np.uint8)
        with _only_the_c_path(monkeypatch):
            buf.copy_from(src, stream=s)
            buf.copy_to(dst, s)
        s.synchronize()
        assert bytes(dst) == bytes(src)
        # Anything else reaches the general path, with its checks and errors.
        with pytest.raises(TypeError):
            buf.copy_from(src, s, 7)  # type: ignore[call-arg]
        big = d.allocate_pinned(8192)
        with pytest.raises(cc.InvalidValueError, match="the source holds 8192 bytes and the buffer 4096"):
            buf.copy_from(big, stream=s)  # larger than the buffer: the general path explains
        big.close()
        src.close()
        with pytest.raises(cc.CUDAError) as info:
            buf.copy_from(src, stream=s)
        assert info.value.name == "CUDACORE_ERROR_CLOSED"
    finally:
        buf.close()
        dst.close()
        s.close()


@pytest.mark.parametrize("n", [4096, (64 << 10) + 1, 5 << 20])
def test_pageable_copies_on_a_stream_take_the_c_path_and_round_trip(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Host memory of the buffer protocol on a Stream (up to 64 KiB with the GIL held, larger with it released):
    C calls the copy door itself; the host memory may be reused once copy_from returns."""
    d = cc.Device(0)
    s = d.create_stream()
    buf = d.allocate(n, stream=s)
    src = np.arange(n, dtype=np.uint32).astype(np.uint8)
    want = src.copy()
    out, raw = np.zeros(n, dtype=np.uint8), bytearray(n)
    try:
        with _only_the_c_path(monkeypatch):
            buf.copy_from(src, stream=s)
            src[:] = 0  # staged already: this must not reach the device
            buf.copy_to(out, stream=s)
            buf.copy_to(raw, s)
            s.synchronize()
        assert np.array_equal(out, want)
        assert bytes(raw) == want.tobytes()
        # Anything else reaches the general path, with its checks and errors.
        with pytest.raises(cc.InvalidValueError, match=r"the source holds \d+ bytes and the buffer \d+"):
            buf.copy_from(np.zeros(n + 1, dtype=np.uint8), stream=s)
        with pytest.raises(cc.InvalidValueError, match="read-only"):
            buf.copy_to(bytes(n), stream=s)
        other = d.create_stream()
        other.close()
        with pytest.raises(cc.CUDAError):
            buf.copy_from(src, stream=other)
    finally:
        buf.close()
        s.close()


@pytest.mark.parametrize("n", [4096, 5 << 20])
def test_copies_given_no_stream_take_the_c_path_while_a_with_stream_block_is_open(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """stream=None with a `with s:` block open: on this thread the copy on s and a wait, on a thread whose
    current stream is the default one (the block is another thread's) the synchronous copy; both in C, as
    without a block anywhere (another thread's block does not send this thread to the general path)."""
    d = cc.Device(0)
    s = d.create_stream()
    buf = d.allocate(n)
    src = np.arange(n, dtype=np.uint32).astype(np.uint8)
    out = np.zeros(n, np.uint8)
    entered, leave = threading.Event(), threading.Event()

    def hold_a_block_open() -> None:
        with s:
            entered.set()
            leave.wait(30)

    t = threading.Thread(target=hold_a_block_open)
    t.start()
    try:
        assert entered.wait(30)
        with _only_the_c_path(monkeypatch):
            buf.copy_from(src)
            buf.copy_to(out)
            assert np.array_equal(out, src)
            out[:] = 0
            with s:
                buf.copy_from(src[::-1].copy())
                buf.copy_to(out)
            assert np.array_equal(out, src[::-1])
    finally:
        leave.set()
        t.join(30)
        buf.close()
        s.close()


# -- adversarial findings: a free in flight with the GIL released counts as closed ---------------------------


def _race_views_against_close(p: Any, view: Any, rounds_close: Any) -> int:
    """Threads: one closes ``p`` (retrying while views exist), one takes views until it sees it closed.
    Returns how often a view taken was still alive once ``p`` reported closed."""
    got: list[Any] = []

    def closer() -> None:
        while True:
            try:
                rounds_close()
                return
            except BufferError:
                pass

    def viewer() -> None:
        for _ in range(50):  # bounded: the closer needs moments without a view to succeed
            if p.closed:
                return
            try:
                v = view()
            except cc.CUDAError:
                return
            time.sleep(0)
            if p.closed:
                got.append(v)
                return
            del v

    t1, t2 = threading.Thread(target=closer), threading.Thread(target=viewer)
    t2.start()
    t1.start()
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert not t1.is_alive() and not t2.is_alive(), "close and views must not hang"
    return len(got)


def test_no_pinned_view_outlives_a_concurrent_close() -> None:
    d = cc.Device(0)
    for _ in range(20):
        p = d.allocate_pinned(1 << 16)

        def view(p: Any = p) -> Any:
            return memoryview(p)

        assert _race_views_against_close(p, view, p.close) == 0
    assert d.memory_stats()["pinned_in_use"] == 0


def test_no_dlpack_capsule_outlives_a_concurrent_close_with_the_sync_strategy() -> None:
    d = cc.Device(0)
    before = d.allocation_strategy
    d.set_allocation_strategy("sync")  # close() releases the GIL for this device
    try:
        for _ in range(20):
            b = d.allocate(1 << 16)

            def export(b: Any = b) -> Any:
                return b.__dlpack__(stream=-1)

            assert _race_views_against_close(b, export, b.close) == 0
        gc.collect()
        assert d.memory_stats()["in_use"] == 0
    finally:
        d.set_allocation_strategy(before)


def test_a_second_close_returns_once_the_memory_is_gone() -> None:
    d = cc.Device(0)
    for _ in range(50):
        p = d.allocate_pinned(1 << 20)
        seen: list[bool] = []
        t = threading.Thread(target=p.close)
        t.start()
        p.close()
        seen.append(p.closed)
        t.join()
        assert seen == [True]


def test_dlpack_for_a_closed_consumer_stream_is_a_closed_error() -> None:
    d = cc.Device(0)
    s = d.create_stream()
    h = s.handle
    s.close()
    b = d.allocate(16)
    try:
        with pytest.raises(cc.CUDAError) as info:
            b.__dlpack__(stream=h)
        assert info.value.name == "CUDACORE_ERROR_CLOSED"
    finally:
        b.close()


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [({"max_version": (2**64, 0)}, "max_version"), ({"dl_device": (2, 2**64)}, "dl_device")],
)
def test_dlpack_version_and_device_overflow_name_the_argument(kwargs: dict[str, Any], arg: str) -> None:
    b = cc.Device(0).allocate(16)
    try:
        with pytest.raises(cc.InvalidValueError, match=arg):
            b.__dlpack__(**kwargs)
    finally:
        b.close()


def test_launch_refuses_a_spec_it_did_not_make() -> None:
    # Sizes other than 1, 2, 4 and 8 bytes, and unknown codes, are left to the general path.
    for spec in (bytes([8, 200, 0]) * 6, bytes([5, 0, 0]) * 6, bytes([0, 4, 0]) * 6, bytes([99, 8, 0]) * 6):
        assert fast.launch(0, 1, 1, 1, 1, 1, 1, 0, 0, [1] * 6, spec) is NotImplemented


def test_c_launch_packer_leaves_values_out_of_range_to_the_general_path() -> None:
    """fast.launch packs plain numbers; a float beyond float32 or an int beyond its parameter must reach
    the Python packers, whose errors name the parameter (never a silently converted value)."""
    d = cc.Device(0)
    k = d.load_module(FILL_PTX).function("fill_f32")
    buf = d.allocate(1024)
    try:
        with pytest.raises(cc.InvalidValueError, match="f32"):
            k.launch(1, 1, (buf, 1e300, 4))
        with pytest.raises(cc.InvalidValueError):
            k.launch(1, 1, (buf, 1.5, -1))  # n is .u64
    finally:
        buf.close()


# -- the cold door: generated METH_FASTCALL wrappers of gopy's exports where every type is a scalar ----------


def test_scalar_cold_entries_are_the_generated_wrappers_and_keep_the_funnel(dev) -> None:
    from cudacore._api import call, core
    from cudacore._native import gopy_wrappers

    assert core.Noop is fast.cold.cudacore_Noop
    assert core.DeviceSynchronize is fast.cold.cudacore_DeviceSynchronize
    assert core.Backend is fast.cold.cudacore_Backend
    # gopy's Python wrapper stays the source of parameter names for the guard's messages.
    assert "cudacore_Noop" in gopy_wrappers
    # Scalars of every kind cross: int, bool and str arguments; int, bool, float and str results.
    assert call(core.Noop, 41) == 41
    assert call(core.Backend) == cc.backend()
    ev = call(core.EventCreate, dev.device_id, True)
    assert isinstance(ev, int) and ev != 0
    call(core.EventDestroy, ev)
    assert call(core.DeviceSynchronize, dev.device_id, 1000, True) is True
    # Go errors arrive typed, through the one funnel.
    with pytest.raises(cc.InvalidValueError, match="device 1048576 does not exist"):
        call(core.StreamCreate, 1 << 20, True, 0)
    with pytest.raises(cc.InvalidHandleError, match="not a live cudacore event"):
        call(core.EventQuery, 123456789)
    # Bad arguments name the function and the argument, as the hot doors do.
    with pytest.raises(TypeError, match=r"Noop\(\): x must be an int, not str"):
        call(core.Noop, "7")
    with pytest.raises(TypeError, match=r"EventCreate\(\): timing must be a bool, not NoneType"):
        call(core.EventCreate, dev.device_id, None)
    with pytest.raises(TypeError, match=r"Noop\(\) takes exactly 1 argument \(2 given\)"):
        call(core.Noop, 1, 2)


def test_the_package_calls_only_wrappers_that_raise_typed_errors() -> None:
    """The Python layer calls ``core.Name(...)`` directly: each such name must be a generated cold wrapper,
    which turns a Go error into its typed exception itself; gopy's own wrappers need ``call``."""
    import re

    from cudacore._native import core

    pkg = ROOT / "python" / "cudacore"
    # Calls in code, not in docs: ``cuda.core.Device(i)`` and ``core.Name(...)`` in prose are not calls.
    code = r"^[^#`\n]*?(?<![.\w])core\.([A-Z]\w+)\("
    called = {m for f in pkg.glob("*.py") for m in re.findall(code, f.read_text(), re.MULTILINE)}
    assert len(called) > 40, "the package's cold calls are found"
    cold = {n.removeprefix("cudacore_") for n in dir(fast.cold) if n.startswith("cudacore_")}
    assert called <= cold, f"called directly but not generated wrappers: {sorted(called - cold)}"
    for name in called:
        assert getattr(core, name) is getattr(fast.cold, "cudacore_" + name), name


def test_a_cold_wrapper_raises_the_typed_error_alone() -> None:
    from cudacore._native import core

    with pytest.raises(cc.InvalidValueError, match="unknown limit") as ei:
        core.DeviceLimit(0, "bogus")
    assert ei.value.__cause__ is None, "gopy's RuntimeError (the same message in wire form) is not chained"
    assert ei.value.name == "CUDA_ERROR_INVALID_VALUE"
    with pytest.raises(TypeError, match=r"Noop\(\): x must be an int, not bool"):
        core.Noop(True)
    with pytest.raises(cc.InvalidValueError, match=r"tile_size must be an integer in \[-2\*\*63, 2\*\*63\)"):
        core.AllocateTiles(0, 1, 2**64, 0, 0)

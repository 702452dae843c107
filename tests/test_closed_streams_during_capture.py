"""Streams closed during a GLOBAL capture (closed to cudacore at once, destroyed at the driver
when the captures end), and the PyTorch doors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

import cudacore as cc
from cudacore._copy import device_to_device, host_to_device

from conftest import objects

N = 1 << 20


@pytest.fixture
def pool_dev(dev: cc.Device) -> cc.Device:
    if dev.allocation_strategy != "pool":
        pytest.skip("stream-ordered allocation needs the pool strategy")
    return dev


def on_other_thread(fn: Any) -> Any:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive(), "hung"
    return out[0]


def test_pending_close_twice_and_from_another_thread(pool_dev: cc.Device, base: Any) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    b = d.allocate(N, stream=u)
    live = objects()["streams"]
    s.begin_capture("global")
    assert on_other_thread(u.close) is None
    u.close()
    assert on_other_thread(u.close) is None
    assert objects()["streams"] == live - 1
    b.close()  # last used on u: waits for the end
    with pytest.raises(cc.CUDAError):
        d.allocate(N, stream=u.handle)
    with pytest.raises(cc.CUDAError):
        cc.Event(d).record(u.handle)
    x = d.allocate(N, stream=s)
    with pytest.raises(cc.CUDAError):
        host_to_device(x, bytes(N), stream=u.handle)
    with pytest.raises(cc.CUDAError):
        device_to_device(x, x, stream=u.handle)
    x.close()
    s.end_capture().destroy()
    assert d.release_cached_memory() == 0
    s.close()


def test_pending_close_then_strategy_and_release(pool_dev: cc.Device, base: Any) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    d.allocate(N, stream=u).close()  # cached on u
    s.begin_capture("global")
    u.close()
    cached = d.memory_stats()["cached"]
    assert d.release_cached_memory() == cached
    try:
        d.set_allocation_strategy("pool")
    except cc.CUDAError:
        pass
    s.end_capture().destroy()
    assert d.release_cached_memory() == 0
    d.set_allocation_strategy("pool")
    s.close()


def test_pending_close_then_handle_reused(pool_dev: cc.Device, base: Any) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    h = u.handle
    s.begin_capture("global")
    u.close()
    s.end_capture().destroy()
    made = []
    for _ in range(64):
        v = d.create_stream()
        made.append(v)
        if v.handle == h:
            break
    reused = made[-1].handle == h
    for v in made:
        d.allocate(N, stream=v).close()
        v.synchronize()
        v.close()
    s.close()
    if not reused:
        pytest.skip("the driver did not reuse the handle")


def test_joined_stream_closed_then_origin_closed(pool_dev: cc.Device, base: Any) -> None:
    d = pool_dev
    s, j = d.create_stream(), d.create_stream()
    s.begin_capture("global")
    j.wait(s.record())
    bj = d.allocate(N, stream=j)
    j.close()
    bj.close()
    s.close()  # abandons the capture: the joined stream's destroy runs now
    assert objects()["captures"] == 0


def test_joined_stream_closed_then_capture_fails_unjoined(pool_dev: cc.Device, base: Any) -> None:
    d = pool_dev
    s, j = d.create_stream(), d.create_stream()
    s.begin_capture("global")
    j.wait(s.record())
    bj = d.allocate(N, stream=j)  # work on j, never joined back: the end fails (904)
    j.close()
    bj.close()
    with pytest.raises(cc.CUDAError):
        s.end_capture()
    assert objects()["captures"] == 0
    s.close()


EXIT = """
import cudacore as cc
d = cc.Device(0)
s, u, j = d.create_stream(), d.create_stream(), d.create_stream()
b = d.allocate(1 << 20, stream=u)
s.begin_capture("global")
j.wait(s.record())
u.close(); j.close(); b.close()
print("exiting", flush=True)
"""


def test_exit_with_pending_destroys() -> None:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT)], capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "PYTHONPATH": str(Path(cc.__file__).resolve().parents[1])})  # the cudacore under test
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exiting" in r.stdout


def test_a_free_from_another_thread_of_a_per_thread_block(pool_dev: cc.Device, base: Any) -> None:
    """stream.Later's reasoning, without a capture: a block allocated (and used) on thread T's per-thread
    default stream and freed at once on another thread is freed on that thread's own per-thread stream,
    which does not follow T's work (both are blocking streams, but neither waits for the other: only the
    legacy stream does). So the free is ordered on the legacy stream, as a waiting one is."""
    d = pool_dev
    b = on_other_thread(lambda: d.allocate(N, stream=cc.Stream.per_thread(d)))
    ptr = b.ptr
    start = cc.flight_record(1)[-1]["seq"]
    b.close()  # on this thread: its per-thread stream is not the one whose work used the block
    frees = [e["stream"] for e in cc.flight_record(after=start) if e["kind"] == "free" and e["ptr"] == ptr]
    assert frees == [cc.Stream.legacy(d).handle], frees


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capturing_stream_closed_from_another_thread(pool_dev: cc.Device, base: Any, mode: str) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    b = d.allocate(N, stream=u)
    s.begin_capture(mode)
    x = d.allocate(N, stream=s)
    u.close()
    b.close()
    got = on_other_thread(s.close)
    assert got is None, got
    assert objects()["captures"] == 0
    x.close()
    d.allocate(N).close()  # nothing captures any more: the legacy stream works
    assert d.release_cached_memory() == 0

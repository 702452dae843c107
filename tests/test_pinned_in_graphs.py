"""Pinned host memory that a graph copies to or from lives as long as the graph (docs/guide/capture.md).

A captured copy between device memory and a PinnedBuffer keeps the host address in the graph, and each
launch reads or writes it again. On the real driver a launch after that memory was freed faults the device
(CUDA_ERROR_LAUNCH_FAILED at the next synchronize, and the context is lost for good) or crashes the process
inside cuGraphLaunch; the GPU fuzzer met both. So closing (or collecting) such a PinnedBuffer marks it
closed, but cudacore frees the memory only once every graph that names it is destroyed; ``pinned_in_use``
counts it until then. The simulator ends the process where the driver would fault, so these tests fail
loudly there too if the free is not deferred. They run on the simulator and on a GPU.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import cudacore as cc

N = 1 << 16


@pytest.fixture
def dev() -> Iterator[cc.Device]:
    d = cc.Device(0)
    s = d.create_stream()
    yield d
    s.close()


def pinned_in_use(d: cc.Device) -> int:
    return int(d.memory_stats()["pinned_in_use"])


@pytest.mark.parametrize("how", ["close", "collect"])
@pytest.mark.parametrize("direction", ["to_device", "to_host"])
def test_a_graph_keeps_the_pinned_memory_it_copies_alive(dev: cc.Device, direction: str, how: str) -> None:
    s = dev.create_stream()
    base = pinned_in_use(dev)
    host = dev.allocate_pinned(N)
    memoryview(host)[:] = b"\x05" * N
    buf = dev.allocate(N, stream=s)
    buf.copy_from(b"\x09" * N, stream=s)
    with s.capture() as g:
        if direction == "to_device":
            buf.copy_from(host, stream=s)
        else:
            buf.copy_to(host, stream=s)
    if how == "close":
        host.close()
        assert host.closed
    else:
        del host
        gc.collect()
    assert pinned_in_use(dev) == base + N, "the graph still names the pinned memory: it stays allocated"
    # New pinned buffers must not be handed the graph's host memory while it lives.
    fresh = [dev.allocate_pinned(N) for _ in range(3)]
    for f in fresh:
        memoryview(f)[:] = b"\x00" * N
    for _ in range(2):
        g.launch(s)  # on a GPU, with the memory freed, this faulted the device or crashed
    s.synchronize()
    for f in fresh:
        assert bytes(memoryview(f)) == b"\x00" * N, "a launch wrote into another PinnedBuffer"
        f.close()
    if direction == "to_device":
        out = bytearray(N)
        buf.copy_to(out, stream=s)
        s.synchronize()
        assert out == b"\x05" * N, "the launch copied the pinned memory's bytes"
    g.destroy()
    assert pinned_in_use(dev) == base, "the deferred free ran when the graph was destroyed"
    buf.close()
    s.close()


def test_pinned_memory_closed_inside_the_capture_that_uses_it_lives_as_long_as_the_graph(dev: cc.Device) -> None:
    s = dev.create_stream()
    base = pinned_in_use(dev)
    host = dev.allocate_pinned(N)
    memoryview(host)[:] = b"\x03" * N
    buf = dev.allocate(N, stream=s)
    s.begin_capture("relaxed")
    buf.copy_from(host, stream=s)
    host.close()  # during the capture: the free waits for its end, and then for the graph
    g = s.end_capture()
    assert pinned_in_use(dev) == base + N
    g.launch(s)
    s.synchronize()
    out = bytearray(N)
    buf.copy_to(out)
    assert out == b"\x03" * N
    g.destroy()
    assert pinned_in_use(dev) == base
    buf.close()
    s.close()


def test_pinned_memory_no_graph_names_is_freed_at_once(dev: cc.Device) -> None:
    s = dev.create_stream()
    base = pinned_in_use(dev)
    used, unused = dev.allocate_pinned(N), dev.allocate_pinned(N)
    buf = dev.allocate(N, stream=s)
    with s.capture() as g:
        buf.copy_from(used, stream=s)
    unused.close()
    assert pinned_in_use(dev) == base + N, "only the memory the graph names is held"
    g.destroy()
    used.close()
    assert pinned_in_use(dev) == base
    buf.close()
    s.close()


CROSS_DEVICE = """
import cudacore as cc
d0, d1 = cc.Device(0), cc.Device(1)
N = 1 << 16
host = d0.allocate_pinned(N)
s = d1.create_stream()
buf = d1.allocate(N, stream=s)
with s.capture() as g:
    buf.copy_from(host, stream=s)  # device 1's graph copies from pinned memory allocated through device 0
host.close()
assert d0.memory_stats()["pinned_in_use"] == N, "device 1's graph names it: it stays allocated"
g.launch(s)  # with the memory freed, the simulator ends the process here, as the driver faults
s.synchronize()
g.destroy()
assert d0.memory_stats()["pinned_in_use"] == 0
buf.close(); s.close()
print("ok")
"""


@pytest.mark.sim
def test_a_graph_of_another_device_keeps_the_pinned_memory_alive() -> None:
    from conftest import run_python

    r = run_python(CROSS_DEVICE, env={"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": '[{"name": "a"}, {"name": "b"}]'},
                   timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[-1] == "ok"


@pytest.mark.sim
def test_a_deferred_pinned_free_that_fails_is_retried(dev: cc.Device) -> None:
    """The free that waited for the graph's destroy has no caller to report a failure to: the memory is
    kept and freed again by the next PinnedBuffer close or release_cached_memory()."""
    from cudacore import testing

    s = dev.create_stream()
    base = pinned_in_use(dev)
    host = dev.allocate_pinned(N)
    buf = dev.allocate(N, stream=s)
    with s.capture() as g:
        buf.copy_from(host, stream=s)
    host.close()
    testing.inject_fault("cuMemFreeHost", 1, "CUDA_ERROR_UNKNOWN")
    g.destroy()  # the waiting free runs and fails
    assert pinned_in_use(dev) == base + N, "still allocated: the driver refused the free"
    dev.release_cached_memory()
    assert pinned_in_use(dev) == base, "the retry freed it"
    other = dev.allocate_pinned(N)
    host2 = dev.allocate_pinned(N)
    with s.capture() as g2:
        buf.copy_from(host2, stream=s)
    host2.close()
    testing.inject_fault("cuMemFreeHost", 1, "CUDA_ERROR_UNKNOWN")
    g2.destroy()
    other.close()  # the next close retries it too
    assert pinned_in_use(dev) == base
    buf.close()
    s.close()

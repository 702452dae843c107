"""Graph memory and the memory graphs use (issue 11, items 6 and 8; docs/guide/capture.md, "Memory during capture").

An allocation made on a capturing stream is real only once its graph is launched. These tests follow its
Buffer through each fate (aborted capture, graph destroyed before or after a launch, closed before the
first launch, launched again) and check that nothing is lost or freed twice: the Buffer's state, the
allocator's in-use bytes, and the device's free memory. They run on the simulator and on a GPU.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

import cudacore as cc

N = 1 << 20


@pytest.fixture(scope="module")
def warm() -> None:
    """A first graph with an allocation sets up the driver's graph memory (on the H100 that holds device
    memory for the process's life), so the tests compare free memory after it."""
    d = cc.Device(0)
    if d.allocation_strategy != "pool":
        return
    s = d.create_stream()
    with s.capture() as g:
        d.allocate(N, stream=s).close()
    g.launch(s)
    s.synchronize()
    g.destroy()
    s.close()


@pytest.fixture
def dev(warm: None) -> Iterator[cc.Device]:
    d = cc.Device(0)
    if d.allocation_strategy != "pool":
        pytest.skip("graph memory nodes need the pool strategy")
    yield d


def in_use(d: cc.Device) -> int:
    return int(d.memory_stats()["in_use"])


def settled_free(d: cc.Device) -> int:
    d.synchronize()
    d.release_cached_memory()
    return d.memory_info()[0]


def test_a_buffer_of_an_aborted_capture_is_closed_and_off_the_books(dev: cc.Device) -> None:
    s = dev.create_stream()
    before = in_use(dev)
    with pytest.raises(RuntimeError, match="boom"), s.capture():
        buf = dev.allocate(N, stream=s)
        assert in_use(dev) == before + N
        raise RuntimeError("boom")
    assert buf.closed, "the driver never allocated it: its Buffer is closed"
    assert in_use(dev) == before
    buf.close()  # idempotent, and frees nothing
    s.close()


def test_a_graph_destroyed_before_any_launch_takes_its_memory_off_the_books(dev: cc.Device) -> None:
    s = dev.create_stream()
    before = in_use(dev)
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
        tiles = dev.allocate_tiles(3, 4096, stream=s)
    assert g.allocations == 4
    assert not buf.closed
    g.destroy()
    assert buf.closed and all(t.closed for t in tiles)
    assert in_use(dev) == before
    dev.set_allocation_strategy("pool")  # nothing is left allocated to block a switch
    s.close()


def test_a_launched_allocation_outlives_its_graph_until_closed(dev: cc.Device) -> None:
    s = dev.create_stream()
    src = dev.allocate_pinned(N)
    memoryview(src)[:] = bytes(range(256)) * (N // 256)
    before, free_before = in_use(dev), settled_free(dev)
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
        buf.copy_from(src, stream=s)
    g.launch(s)
    s.synchronize()
    g.destroy()
    assert not buf.closed, "launched graph memory is the Buffer's until it is closed"
    out = bytearray(N)
    buf.copy_to(out)
    assert out == memoryview(src)
    assert in_use(dev) == before + N
    buf.close()
    assert in_use(dev) == before
    if cc.backend() == "sim":
        # On the H100 (driver 580) 2 MiB of such an allocation stay with the driver even after a trim
        # (docs/contributing/driver-facts.md, "Graph memory"); cudacore's own accounting above is exact on both.
        assert settled_free(dev) == free_before
    src.close()
    s.close()


def test_launching_again_while_the_last_allocation_is_open_is_refused_clearly(dev: cc.Device) -> None:
    s = dev.create_stream()
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
    g.launch(s)
    with pytest.raises(cc.IllegalStateError, match="still open"):
        g.launch(s)
    buf.close()
    for _ in range(3):  # no owner now: each launch's allocation is freed after it
        g.launch(s)
    s.synchronize()
    before = in_use(dev)
    g.destroy()
    assert in_use(dev) == before
    s.close()


def test_a_buffer_closed_before_the_first_launch_is_freed_after_every_launch(dev: cc.Device) -> None:
    s = dev.create_stream()
    before, free_before = in_use(dev), settled_free(dev)
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
    buf.close()
    assert in_use(dev) == before
    for _ in range(3):  # each would fail if the last launch's allocation had not been freed
        g.launch(s)
    s.synchronize()
    g.destroy()
    assert in_use(dev) == before
    assert settled_free(dev) == free_before
    s.close()


def test_memory_freed_inside_the_capture_is_a_free_node(dev: cc.Device) -> None:
    s = dev.create_stream()
    before, free_before = in_use(dev), settled_free(dev)
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
        buf.close()
    for _ in range(2):
        g.launch(s)
    s.synchronize()
    g.destroy()
    assert in_use(dev) == before
    assert settled_free(dev) == free_before
    s.close()


def test_closing_a_stream_that_captures_voids_its_allocations(dev: cc.Device) -> None:
    s = dev.create_stream()
    before = in_use(dev)
    s.begin_capture()
    buf = dev.allocate(N, stream=s)
    s.close()
    assert buf.closed
    assert in_use(dev) == before


def test_a_graph_keeps_the_memory_its_copies_use_alive(dev: cc.Device) -> None:
    """Item 6: closing a Buffer a live graph writes to must not let the graph write into its next owner."""
    s = dev.create_stream()
    src = dev.allocate_pinned(N)
    memoryview(src)[:] = b"\x07" * N
    target = dev.allocate(N, stream=s)
    old_ptr = target.ptr
    with s.capture() as g:
        target.copy_from(src, stream=s)
    before = in_use(dev)
    target.close()
    assert target.closed
    assert in_use(dev) == before, "the memory stays allocated while the graph lives"
    fresh = [dev.allocate(N, stream=s) for _ in range(4)]
    assert old_ptr not in {b.ptr for b in fresh}, "the graph's memory was handed to a new owner"
    for b in fresh:
        b.copy_from(b"\x00" * N)
    g.launch(s)
    s.synchronize()
    out = bytearray(N)
    for b in fresh:
        b.copy_to(out)
        assert out == b"\x00" * N, "a launch wrote into another buffer"
        b.close()
    g.destroy()
    assert in_use(dev) == before - N, "the deferred free ran when the graph was destroyed"
    src.close()
    s.close()


def test_a_graph_keeps_a_garbage_collected_buffer_alive(dev: cc.Device) -> None:
    s = dev.create_stream()
    src = dev.allocate_pinned(4096)
    before = in_use(dev)
    target = dev.allocate(4096, stream=s)
    with s.capture() as g:
        target.copy_from(src, stream=s)
    del target  # collected: its free waits for the graph
    assert in_use(dev) == before + 4096
    g.launch(s)
    s.synchronize()
    g.destroy()
    assert in_use(dev) == before
    src.close()
    s.close()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("op", ["copy_from", "onto_itself"])
def test_a_buffer_closed_inside_the_capture_that_uses_it_lives_as_long_as_the_graph(dev: cc.Device, mode: str, op: str) -> None:
    """The free of a Buffer closed inside the capture that uses it waits for the capture's end, and then
    for the graph: it used to run before the graph took the capture's uses, so the graph named freed
    memory, and on the H100 cuGraphInstantiate crashed the process (the fuzzer found it)."""
    s = dev.create_stream()
    src = dev.allocate_pinned(N)
    memoryview(src)[:] = b"\x05" * N
    before = in_use(dev)
    target = dev.allocate(N, stream=s)
    s.synchronize()
    with s.capture(mode) as g:
        if op == "copy_from":
            target.copy_from(src, stream=s)
        else:
            cc.device_to_device(target, target, stream=s)
        target.close()
        assert target.closed
    assert in_use(dev) == before + N, "the graph keeps the memory it names"
    assert g.node_count == 1
    for _ in range(2):
        g.launch(s)
    s.synchronize()
    g.destroy()
    assert in_use(dev) == before, "the free ran when the graph was destroyed"
    src.close()
    s.close()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_graph_is_not_launched_into_a_capture_and_the_capture_goes_on(dev: cc.Device, mode: str) -> None:
    """The driver refuses every graph launch on a capturing stream (900, and it ends the capture; measured
    on the H100 in each mode). cudacore refuses first, so the capture goes on and nothing it names is lost."""
    s1, s2 = dev.create_stream(), dev.create_stream()
    src = dev.allocate_pinned(N)
    before = in_use(dev)
    target = dev.allocate(N, stream=s1)
    s1.synchronize()
    with s1.capture() as inner:
        target.copy_from(src, stream=s1)
    with s2.capture(mode) as outer:
        with pytest.raises(cc.CaptureError, match="cannot be launched on a stream that captures") as refused:
            inner.launch(s2)
        assert refused.value.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        target.copy_to(src, stream=s2)  # the capture goes on
    assert outer.node_count == 1
    target.close()
    inner.destroy()
    outer.launch(s2)
    s2.synchronize()
    outer.destroy()
    assert in_use(dev) == before
    src.close()
    s1.close()
    s2.close()


def test_launched_graph_memory_that_another_graph_uses_lives_as_long_as_that_graph(dev: cc.Device) -> None:
    """Once launched, graph memory is an ordinary allocation; a graph captured later that copies into it
    must keep it alive as for any Buffer. Its close used to free it at once (the graph memory rule came
    before the users'), so once the allocating graph was gone the later graph named freed memory (its
    instantiation crashes the H100: the simulator's fatal hook, exit 139)."""
    s1, s2 = dev.create_stream(), dev.create_stream()
    src = dev.allocate_pinned(N)
    before = in_use(dev)
    with s1.capture() as alloc_graph:
        buf = dev.allocate(N, stream=s1)
    alloc_graph.launch(s1)
    s1.synchronize()
    s2.begin_capture()
    buf.copy_from(src, stream=s2)
    user = s2.end_capture()
    buf.close()
    alloc_graph.destroy()
    assert in_use(dev) == before + N, "the later graph keeps the memory it copies into"
    user.launch(s2)
    s2.synchronize()
    user.destroy()
    assert in_use(dev) == before
    src.close()
    s1.close()
    s2.close()


def test_an_updated_graph_keeps_the_memory_of_the_graph_it_took_alive(dev: cc.Device) -> None:
    """Graph.update takes the other graph's copies into the executable graph: it names the other graph's
    memory from then on, and must keep it alive after the other graph and its Buffers are gone. It used
    to keep only its own, so a later launch wrote into freed memory (the simulator refuses the launch)."""
    s = dev.create_stream()
    src = dev.allocate_pinned(N)
    memoryview(src)[:] = b"\x0b" * N
    before = in_use(dev)
    a, b = dev.allocate(N, stream=s), dev.allocate(N, stream=s)
    s.synchronize()
    with s.capture() as g1:
        a.copy_from(src, stream=s)
    with s.capture() as g2:
        b.copy_from(src, stream=s)
    g1.update(g2)
    b.close()
    g2.destroy()
    assert in_use(dev) == before + 2 * N, "g1 names b's memory since the update"
    g1.launch(s)
    s.synchronize()
    a.close()
    assert in_use(dev) == before + 2 * N, "and still names a's in its graph"
    g1.destroy()
    assert in_use(dev) == before
    src.close()
    s.close()


def test_a_graph_that_allocates_is_not_updated(dev: cc.Device) -> None:
    """The driver would move the executable graph's allocations to the other graph's addresses, so a launch
    would allocate memory that no Buffer owns. The update is refused either way round, also for graphs
    whose allocations are freed inside the capture, and changes nothing."""
    s = dev.create_stream()
    src = dev.allocate_pinned(N)
    memoryview(src)[:] = b"\x2c" * N
    before, free = in_use(dev), settled_free(dev)
    graphs, bufs = [], []
    for _ in range(2):
        with s.capture() as g:
            buf = dev.allocate(N, stream=s)
            buf.copy_from(src, stream=s)
        graphs.append(g)
        bufs.append(buf)
    g1, g2 = graphs
    scratch = []
    for _ in range(2):
        with s.capture() as g:
            dev.allocate(N, stream=s).copy_from(src, stream=s)  # dropped, so freed inside the capture
            gc.collect()
        scratch.append(g)
    for dst, other in ((g1, g2), (g2, g1), tuple(scratch)):
        with pytest.raises(cc.CUDAError, match="allocated memory during its capture") as exc:
            dst.update(other)
        assert exc.value.name == "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"
    for g in scratch:
        assert g.allocations == 1
        g.destroy()
    g1.launch(s)
    s.synchronize()
    out = bytearray(N)
    bufs[0].copy_to(out)
    assert out == b"\x2c" * N, "g1 still allocates its own Buffer"
    for b in bufs:
        b.close()
    g1.destroy()
    g2.destroy()
    assert in_use(dev) == before
    assert settled_free(dev) == free
    src.close()
    s.close()


@pytest.mark.gpu
def test_gpu_a_graph_keeps_the_memory_its_kernel_writes_alive(dev: cc.Device) -> None:
    from pathlib import Path

    import numpy as np

    n = 1 << 16
    s = dev.create_stream()
    with dev.load_module(Path(__file__).parent / "kernels" / "fill.ptx") as mod:
        fill = mod.function("fill")
        target = dev.allocate(4 * n, stream=s)
        old_ptr = target.ptr
        with s.capture() as g:
            fill.launch(grid=n // 256, block=256, args=(target, np.uint32(0xABCD), np.uint64(n)), stream=s)
        target.close()  # the graph's kernel still writes there
        fresh = [dev.allocate(4 * n, stream=s) for _ in range(4)]
        assert old_ptr not in {b.ptr for b in fresh}
        for b in fresh:
            b.copy_from(b"\x00" * (4 * n))
        g.launch(s)
        s.synchronize()
        out = bytearray(4 * n)
        for b in fresh:
            b.copy_to(out)
            assert out == b"\x00" * (4 * n), "the kernel wrote into another buffer"
            b.close()
        g.destroy()
    s.close()


@pytest.mark.parametrize("mode", ["relaxed", "thread_local"])
def test_a_buffer_closed_during_another_capture_then_voided_is_freed_once(dev: cc.Device, mode: str) -> None:
    # Found by the fuzzer (seed 7302): b's close waits for the second capture to end; destroying its graph
    # meanwhile voids its memory. The waiting free must still find the address void (and free nothing),
    # or the bytes leave in_use twice. In RELAXED mode the graph is destroyed at once; in THREAD_LOCAL mode
    # the destroy is an unsafe call, so it too waits for the capture to end, after b's free.
    s = dev.create_stream()
    before = in_use(dev)
    with s.capture() as g:
        b = dev.allocate(N, stream=s)
    s.begin_capture(mode)
    try:
        b.close()
        g.destroy()
    finally:
        s.end_capture().destroy()
    assert in_use(dev) == before
    s.close()


@pytest.mark.parametrize("how", ["destroy", "collect"])
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_a_graph_destroyed_during_a_capture_goes_when_the_capture_ends(dev: cc.Device, mode: str, how: str) -> None:
    # Destroying an executable graph is an unsafe call during a GLOBAL capture, and during a THREAD_LOCAL
    # one on the capturing thread: the driver refuses it (900) and invalidates the capture.
    # cudacore destroys the graph once the capture ends, so the capture survives, and what the graph held
    # (here graph memory no launch made real) is given back then.
    s, other = dev.create_stream(), dev.create_stream()
    before = in_use(dev)
    with other.capture() as g:
        b = dev.allocate(N, stream=other)
    s.begin_capture(mode)
    try:
        if how == "destroy":
            g.destroy()
            assert g.destroyed
        else:
            del g
            gc.collect()
        assert not b.closed, "the graph is destroyed once the capture ends"
    finally:
        captured = s.end_capture()  # raised CaptureError when the destroy reached the driver
    assert b.closed, "its memory was never allocated: void once its graph is gone"
    captured.destroy()
    assert in_use(dev) == before
    s.close()
    other.close()


def test_a_graph_that_allocates_is_not_launched_into_a_capture(dev: cc.Device) -> None:
    # Found by the fuzzer (seeds 104843 and 104824, with threads): a thread launched g on a stream that
    # another thread had just begun to capture, and the simulator then took it as a launch that allocated
    # nothing, which left b's books wrong. The launch is refused before the driver sees it, as every graph
    # launch into a capture is (the real driver refuses them all), and g's later launches work.
    s, other = dev.create_stream(), dev.create_stream()
    before = in_use(dev)
    with s.capture() as g:
        b = dev.allocate(N, stream=s)
    other.begin_capture("relaxed")
    try:
        with pytest.raises(cc.CaptureError, match="cannot be launched on a stream that captures"):
            g.launch(other)
    finally:
        other.end_capture().destroy()  # the refused launch left the capture going
    g.launch(s)  # the first launch, which makes b real
    s.synchronize()
    b.close()
    g.launch(s)  # b's memory was freed: nothing holds the last launch's allocation
    s.synchronize()
    g.destroy()
    assert in_use(dev) == before
    s.close()
    other.close()


# ---- use of graph memory before its graph's first launch ----------------------------------------------


def test_graph_memory_used_in_another_capture_before_any_launch_is_refused(dev: cc.Device) -> None:
    base = dev.memory_stats()["in_use"]
    s1, s2 = dev.create_stream(), dev.create_stream()
    pin = dev.allocate_pinned(N)
    with s1.capture() as ga:
        p = dev.allocate(N, stream=s1)
    s2.begin_capture()
    with pytest.raises(cc.IllegalStateError, match="launch the graph first"):
        p.copy_from(pin, stream=s2)
    gb = s2.end_capture()
    ga.destroy()  # p's memory never existed
    gb.instantiate()  # holds no copy naming p: nothing crashes
    gb.destroy()
    assert p.closed
    p.close()
    pin.close()
    s1.close()
    s2.close()
    assert dev.memory_stats()["in_use"] == base


@pytest.mark.parametrize("stream", [False, True])
def test_graph_memory_used_before_its_graph_s_first_launch_is_refused_then_works_after(dev: cc.Device, stream: bool) -> None:
    base = dev.memory_stats()["in_use"]
    s1, s2 = dev.create_stream(), dev.create_stream()
    pin = dev.allocate_pinned(N)
    other = dev.allocate(N)
    with s1.capture() as ga:
        p = dev.allocate(N, stream=s1)
    kw = {"stream": s2} if stream else {}
    with pytest.raises(cc.IllegalStateError, match="never launched"):
        p.copy_from(pin, **kw)
    with pytest.raises(cc.IllegalStateError):
        p.copy_to(pin, **kw)
    with pytest.raises(cc.IllegalStateError):
        cc.device_to_device(other, p, **kw)
    with pytest.raises(cc.IllegalStateError):
        cc.device_to_device(p, other, **kw)
    with pytest.raises(cc.IllegalStateError):
        p.__dlpack__(stream=-1)
    ga.launch(s1)
    s1.synchronize()
    del_capsule = p.__dlpack__(stream=-1)  # exported once launched
    del del_capsule
    pin.numpy()[:] = 7
    p.copy_from(pin, **kw)
    cc.device_to_device(other, p, **kw)
    pin.numpy()[:] = 0
    other.copy_to(pin, **kw)
    s2.synchronize()
    assert (pin.numpy() == 7).all()
    p.close()
    ga.destroy()
    other.close()
    pin.close()
    s1.close()
    s2.close()
    assert dev.memory_stats()["in_use"] == base


def test_graph_memory_used_inside_its_capture_still_works(dev: cc.Device) -> None:
    base = dev.memory_stats()["in_use"]
    s1 = dev.create_stream()
    pin = dev.allocate_pinned(N)
    pin.numpy()[:] = 3
    out = dev.allocate_pinned(N)
    with s1.capture() as ga:
        p = dev.allocate(N, stream=s1)
        p.copy_from(pin, stream=s1)
        p.copy_to(out, stream=s1)
    ga.launch(s1)
    s1.synchronize()
    assert (out.numpy() == 3).all()
    p.close()
    ga.destroy()
    pin.close()
    out.close()
    s1.close()
    assert dev.memory_stats()["in_use"] == base


@pytest.mark.sim
def test_an_address_of_discarded_graph_memory_handed_out_again_is_ordinary_memory(dev: cc.Device, base: Any) -> None:
    """The driver may hand the address of discarded graph memory out again, to a pool allocation of the
    same size say: the new Buffer's free is a real free, not the old owner's no-op, so its bytes leave
    in_use and go back to the device."""
    from cudacore import testing

    testing.set_memory_conditions(0, {"reuse_addresses": True})
    try:
        s = dev.create_stream()
        free_before = settled_free(dev)
        with pytest.raises(RuntimeError, match="boom"), s.capture():
            discarded = dev.allocate(N, stream=s)
            addr = discarded.ptr
            raise RuntimeError("boom")
        assert discarded.closed
        again = dev.allocate(N, stream=s)
        assert again.ptr == addr, "the simulator reused the address, as the driver may"
        again.close()
        assert in_use(dev) == 0
        assert settled_free(dev) == free_before
        s.close()
    finally:
        testing.set_memory_conditions(0, {})


@pytest.mark.sim
@pytest.mark.parametrize("reissue", ["ordinary", "capture", "voided capture, then ordinary"])
def test_a_late_free_of_void_graph_memory_never_frees_the_address_s_next_owner(dev: cc.Device, base: Any, reissue: str) -> None:
    """A Buffer of a capture, closed while a stream had joined the capture, waits for the captures to end
    before its free runs. If that capture then fails, its memory is void, and the driver may hand the
    address to a new owner before the free runs (another capture still going holds it back): the late
    free must free nothing. By address alone it freed the new owner's memory (the GPU fuzzer: in_use
    near 2**64, then a failed double free). With a second capture given the address and aborted in
    between, the Python layer's closing of that capture's Buffer also forgot the first owner's stale
    token, and the late free freed the third owner's memory (found by an adversarial review)."""
    from cudacore import testing

    testing.set_memory_conditions(0, {"reuse_addresses": True})
    s, j, other, u = (dev.create_stream() for _ in range(4))
    spare: list[cc.Buffer] = []
    try:
        other.begin_capture("relaxed")  # keeps every free that waits for the captures waiting
        s.begin_capture("relaxed")
        j.wait(s.record())  # j joins s's capture
        b = dev.allocate(N, stream=j)
        addr = b.ptr
        b.close()  # graph memory of a capture with a joined stream: its free waits for the captures to end
        with pytest.raises(cc.CaptureError):
            s.end_capture()  # j's work was never joined back (904): the capture fails, b's memory is void
        if reissue == "capture":
            s.begin_capture("relaxed")
            new = dev.allocate(N, stream=s)
        else:
            if reissue == "voided capture, then ordinary":
                with pytest.raises(RuntimeError, match="boom"), s.capture(mode="relaxed"):
                    second = dev.allocate(N, stream=s)
                    assert second.ptr == addr
                    raise RuntimeError("boom")
                assert second.closed, "void: closed for us"
            new = dev.allocate(N, stream=u)
            while new.ptr != addr and len(spare) < 8:  # lower free addresses first; closed at the end
                spare.append(new)
                new = dev.allocate(N, stream=u)
        assert new.ptr == addr, "the simulator handed the address out again, as the driver may"
        held = in_use(dev)
        other.end_capture().destroy()  # the last capture ends: the waiting free runs now
        assert in_use(dev) == held, "the late free of the void memory took the new owner's bytes"
        if reissue == "capture":
            s.end_capture().destroy()  # never launched: its memory is void, and new is closed
        new.close()
        for x in spare:
            x.close()
        assert in_use(dev) == 0
    finally:
        testing.set_memory_conditions(0, {})
        for x in (s, j, other, u):
            x.close()


@pytest.mark.sim
def test_a_void_report_never_closes_a_newer_buffer_at_the_same_address(dev: cc.Device, base: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between Go's report of void memory and the Python layer's lookup of the Buffer at that address,
    another thread's capture may be handed the address. Its Buffer is live (here its graph is launched),
    and only the Buffer of the owner whose token went stale is closed; the newer one stayed open only by
    chance before (an adversarial review: launched Buffers found closed, their memory leaked)."""
    from cudacore import _stream, testing

    testing.set_memory_conditions(0, {"reuse_addresses": True})
    s, s2 = dev.create_stream(), dev.create_stream()
    newer: list[Any] = []
    report = _stream.core.GraphVoided

    def report_then_reissue(device: int) -> str:
        text = report(device)
        if text and not newer:  # as if another thread ran between the report and the lookup
            s2.begin_capture("relaxed")
            newer.append(dev.allocate(N, stream=s2))
        return text

    monkeypatch.setattr(_stream.core, "GraphVoided", report_then_reissue)
    try:
        s.begin_capture("relaxed")
        old = dev.allocate(N, stream=s)
        addr = old.ptr
        s.abort_capture()
        assert old.closed, "void: closed for us"
        (c,) = newer
        assert not c.closed, "the newer owner's Buffer was closed by the older owner's void report"
        assert c.ptr == addr, "the simulator handed the address out again, as the driver may"
        g = s2.end_capture()
        g.launch(s2)
        s2.synchronize()
        c.copy_from(b"\x07" * N)
        out = bytearray(N)
        c.copy_to(out)
        assert out[:1] == b"\x07", "the newer Buffer holds its launch's memory"
        c.close()
        g.destroy()
        assert in_use(dev) == 0
    finally:
        monkeypatch.undo()
        testing.set_memory_conditions(0, {})
        s.close()
        s2.close()


def test_an_allocation_made_after_a_captured_one_was_freed_has_no_owner_token(dev: cc.Device, base: Any) -> None:
    """The owner token of memory allocated in a capture is dropped once its owner freed it, so a later
    owner of the address (here an ordinary allocation made while another stream captures) never carries
    it: its close is an ordinary free."""
    s, other = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        b = dev.allocate(N, stream=s)
    assert b._graph_token != 0
    g.launch(s)
    s.synchronize()
    b.close()
    g.destroy()
    other.begin_capture("relaxed")
    x = dev.allocate(N, stream=s)  # noted: a capture runs, but x is not graph memory
    assert x._graph_token == 0
    other.end_capture().destroy()
    x.close()
    assert in_use(dev) == 0
    s.close()
    other.close()


def test_tiles_voided_before_they_are_noted_are_closed(dev: cc.Device) -> None:
    # allocate_tiles releases the GIL and calls its progress callback between batches: a capture that ends
    # meanwhile (here in the callback) voids the graph memory its first batch got before those Buffers
    # reach the capture bookkeeping. They are closed when they do; the tiles allocated after the capture
    # ended are ordinary memory and stay open.
    s = dev.create_stream()
    try:
        s.begin_capture()

        def abort(done: int, total: int) -> bool:
            if s.capturing:
                s.abort_capture()
            return True

        tiles = dev.allocate_tiles(20, 256, stream=s, progress=abort)
        voided = [t for t in tiles if t.closed]
        assert voided and len(voided) < len(tiles), "the first batch was graph memory, the rest is not"
        with pytest.raises(cc.CUDAError, match="closed"):
            voided[0].fill(0)
        for t in tiles:
            if not t.closed:
                t.fill(1)
            t.close()
        s.synchronize()
        assert in_use(dev) == 0
    finally:
        s.close()

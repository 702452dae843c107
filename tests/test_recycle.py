"""The recycle log (docs/contributing/design.md, "The recycle log"): a Buffer closed on the legacy stream hands its block to
the next allocation of its size there without entering Go, and Go accounts for both before anything else.

These run on the simulator and on the GPU: the log is the same C and Go on both.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import cudacore as cc

from conftest import run_python


@pytest.fixture
def d() -> Iterator[cc.Device]:
    # Python stacks label every allocation, which needs Go: an earlier test's track=True leaves them on.
    stacks = cc.configure_flight_recorder()["python_stacks"]
    cc.configure_flight_recorder(python_stacks=False)
    dev = cc.Device(0)
    base = dev.memory_stats()["in_use"]
    yield dev
    gc.collect()
    assert dev.memory_stats()["in_use"] == base, "a test left memory allocated"
    cc.configure_flight_recorder(python_stacks=stacks)


def counters(d: cc.Device) -> dict[str, int]:
    s = d.memory_stats()
    return {k: s[k] for k in ("in_use", "allocations", "frees", "recycled", "failures")}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def pairs(d: cc.Device, n: int, size: int = 4096, **kw: object) -> set[int]:
    ptrs = set()
    for _ in range(n):
        b = d.allocate(size, **kw)  # type: ignore[arg-type]
        ptrs.add(b.ptr)
        b.close()
    return ptrs


def test_pairs_on_the_legacy_stream_are_recycled_and_every_call_is_counted(d: cc.Device) -> None:
    before = counters(d)
    ptrs = pairs(d, 200)
    got = delta(counters(d), before)
    assert got["allocations"] == 200 and got["frees"] == 200, got
    assert got["in_use"] == 0 and got["failures"] == 0, got
    assert got["recycled"] >= 190, f"the pair should be served in C after its first round: {got}"
    assert len(ptrs) == 1, "one block, handed from each closed buffer to the next allocation"


def test_collected_buffers_recycle_too(d: cc.Device) -> None:
    before = counters(d)
    for _ in range(50):
        d.allocate(8192)  # dropped at once: its dealloc frees it
    got = delta(counters(d), before)
    assert (got["allocations"], got["frees"], got["in_use"]) == (50, 50, 0), got
    assert got["recycled"] >= 45, got


def test_the_flight_record_shows_each_recycled_pair_in_order(d: cc.Device) -> None:
    warm = d.allocate(12288)
    warm_ptr = warm.ptr
    warm.close()
    # Any call into Go replays the log first: warm's free is on the record before the seq read here.
    after = max((e["seq"] for e in cc.flight_record(1)), default=0)
    before = counters(d)
    ptrs = pairs(d, 3, 12288)  # the first allocation through Go (its cache), the next two from the log
    assert delta(counters(d), before)["recycled"] == 2
    events = [e for e in cc.flight_record(after=after, device=0) if e["size"] == 12288]
    assert [e["kind"] for e in events] == ["alloc", "free"] * 3, events
    assert {e["ptr"] for e in events} == ptrs == {warm_ptr}
    base = before["in_use"]
    assert [e["in_use"] for e in events] == [base + 12288, base] * 3
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


def test_a_closed_buffer_counts_as_freed_for_the_next_call(d: cc.Device) -> None:
    # The limit sees the close before the next allocation, of another size, asks for room.
    d.memory_limit = 1 << 20
    try:
        b = d.allocate(768 << 10)
        b.close()
        c = d.allocate(512 << 10)  # would exceed the limit if the close had not reached the allocator
        c.close()
    finally:
        d.memory_limit = None
    # And a strategy change, refused while memory is allocated, is not refused for closed buffers.
    b = d.allocate(4096)
    b.close()
    d.set_allocation_strategy(d.allocation_strategy)


@pytest.mark.parametrize(
    ("where", "recycled"),
    [("owned stream", 19), ("current stream under with", 19), ("per-thread stream", 0), ("bare handle", 0)],
)
def test_which_streams_recycle(d: cc.Device, where: str, recycled: int) -> None:
    # A Stream of cudacore's, named by its object (or current under `with s:`), recycles as the legacy
    # stream does; the per-thread stream's handle is shared by every thread, and a bare handle may be
    # another library's stream, destroyed behind cudacore's back: those never do.
    s = d.create_stream()
    try:
        before = counters(d)
        if where == "current stream under with":
            with s:
                pairs(d, 20, stream=None)
        else:
            pairs(d, 20, stream={"owned stream": s, "per-thread stream": 2, "bare handle": s.handle}[where])
        s.synchronize()
        got = delta(counters(d), before)
        assert (got["allocations"], got["frees"], got["in_use"]) == (20, 20, 0), got
        assert got["recycled"] == recycled, got
    finally:
        s.close()


@pytest.mark.sim
def test_a_closed_streams_logged_frees_never_reach_its_reused_handle(d: cc.Device) -> None:
    # The simulator hands a destroyed stream's handle to the next stream, as the driver does. A buffer of
    # the closed stream, closed afterwards, is freed on the legacy stream; the new stream with the same
    # handle gets none of the old stream's work, and everything adds up.
    from cudacore._api import core

    core.SimSetMemoryConditions(0, '{"reuse_handles": true}')
    try:
        s = d.create_stream()
        late = d.allocate(4096, stream=s)
        pairs(d, 5, stream=s)
        old = s.handle
        s.close()
        t = d.create_stream()
        assert t.handle == old
        before = counters(d)
        late.close()  # logged against the dead handle: Go frees it on the legacy stream
        b = d.allocate(4096, stream=t)  # may take the logged block: the old stream was synchronized
        b.close()
        t.close()
        got = delta(counters(d), before)
        assert (got["frees"] - got["allocations"], got["in_use"]) == (1, -4096), got
    finally:
        core.SimSetMemoryConditions(0, "{}")


def test_no_recycling_while_a_stream_captures(d: cc.Device) -> None:
    s = d.create_stream()
    b = d.allocate(4096)  # made before the capture: its free must wait for the capture to end
    before = counters(d)
    s.begin_capture("relaxed")
    try:
        b.close()
        c = d.allocate(4096)
        c.close()
    finally:
        graph = s.end_capture()
    got = delta(counters(d), before)
    assert got["recycled"] == 0, got
    graph.destroy()
    s.close()
    pairs(d, 5)  # recycling resumes once the capture is over
    assert counters(d)["recycled"] > before["recycled"]


def test_a_live_graph_keeps_only_the_memory_it_uses_off_the_log(d: cc.Device) -> None:
    # A graph that copies into `used` keeps `used` alive until the graph is destroyed (its launches write
    # there); every other pair recycles meanwhile. The block of `used` is never handed to a new
    # allocation while the graph lives, however many allocations of its size follow.
    s = d.create_stream()
    pinned = d.allocate_pinned(4096)
    used = d.allocate(4096)
    with s.capture() as graph:
        used.copy_from(pinned, stream=s)
    graph.launch(s)
    s.synchronize()
    used_ptr = used.ptr
    before = counters(d)
    pairs(d, 20)
    got = delta(counters(d), before)
    assert got["recycled"] == 19, got  # unrelated memory recycles while the graph lives
    used.close()  # its free waits for the graph
    handed = pairs(d, 50)
    assert used_ptr not in handed
    assert counters(d)["in_use"] == before["in_use"], "used is still held for the graph"
    graph.launch(s)  # still writes into used's block, which nobody else has
    s.synchronize()
    graph.destroy()
    assert counters(d)["in_use"] == before["in_use"] - 4096
    pinned.close()
    s.close()


@pytest.mark.parametrize("mode", ["tracking", "python stacks", "sync strategy"])
def test_what_needs_every_call_in_go_stops_recycling(d: cc.Device, mode: str) -> None:
    strategy = d.allocation_strategy
    stacks = cc.configure_flight_recorder()["python_stacks"]
    if mode == "tracking":
        d.set_allocation_strategy(strategy, track=True)  # turns Python stacks on, for good
    elif mode == "python stacks":
        cc.configure_flight_recorder(python_stacks=True)
    else:
        d.set_allocation_strategy("sync")
    try:
        before = counters(d)
        pairs(d, 20)
        got = delta(counters(d), before)
        assert (got["allocations"], got["frees"], got["recycled"]) == (20, 20, 0), got
    finally:
        d.set_allocation_strategy(strategy)
        cc.configure_flight_recorder(python_stacks=stacks)
    before = counters(d)
    pairs(d, 5)
    assert counters(d)["recycled"] > before["recycled"], "recycling resumes"


def test_threads_recycle_without_losing_a_call(d: cc.Device) -> None:
    before = counters(d)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            pairs(d, 500, 4096 * (1 + i % 3))
        except Exception as e:  # noqa: BLE001 - reported by the main thread below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = delta(counters(d), before)
    assert (got["allocations"], got["frees"], got["in_use"], got["failures"]) == (4000, 4000, 0, 0), got
    assert got["recycled"] > 0


def test_recycle_off_by_environment() -> None:
    code = """
import cudacore as cc
d = cc.Device(0)
for _ in range(50):
    d.allocate(4096).close()
s = d.memory_stats()
print(s["allocations"], s["frees"], s["recycled"], s["in_use"])
"""
    off = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_RECYCLE": "0"})
    on = run_python(code, {"CUDACORE_BACKEND": "sim"})
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    assert off.stdout.split() == ["50", "50", "0", "0"]
    allocations, frees, recycled, in_use = map(int, on.stdout.split())
    assert (allocations, frees, in_use) == (50, 50, 0) and recycled >= 45


def test_an_aborted_capture_leaves_nothing_on_the_graph_books(d: cc.Device) -> None:
    # Its Buffers are void (never allocated by the driver) and marked closed; Go forgets them, rather than
    # keeping every later free on the graph-aware path and the recycle log off for good.
    s = d.create_stream()
    with pytest.raises(RuntimeError, match="boom"), s.capture():
        buf = d.allocate(4096, stream=s)
        raise RuntimeError("boom")
    assert buf.closed
    s.close()
    before = counters(d)
    pairs(d, 10)
    assert delta(counters(d), before)["recycled"] >= 9


def test_a_limit_lowered_below_what_is_in_use_fails_recycled_allocations_too(d: cc.Device) -> None:
    warm = d.allocate(4096)
    warm.close()
    a, b = d.allocate(4096), d.allocate(4096)
    d.memory_limit = 4096  # below the 8 KiB in use: every later allocation fails until enough is freed
    try:
        a.close()
        with pytest.raises(cc.OutOfMemoryError):
            d.allocate(4096)
    finally:
        d.memory_limit = None
        b.close()
    before = counters(d)
    pairs(d, 5)
    assert delta(counters(d), before)["recycled"] >= 4, "recycling resumes without the limit"


def test_recycled_events_keep_the_time_they_happened(d: cc.Device) -> None:
    import time

    warm = d.allocate(20480)
    warm.close()
    after = max((e["seq"] for e in cc.flight_record(1)), default=0)
    b = d.allocate(20480)  # through Go: the log was replayed by flight_record
    b.close()  # logged
    time.sleep(0.2)
    c = d.allocate(20480)  # taken from the log, 0.2 s after the close
    time.sleep(0.2)
    c.close()  # logged, and taken by nothing
    time.sleep(0.2)
    d.allocate(8192).close()  # into Go, 0.2 s later: the replay records the three ops above first
    events = [e for e in cc.flight_record(after=after, device=0) if e["size"] in (20480, 8192)]
    assert [(e["kind"], e["size"]) for e in events][:5] == [
        ("alloc", 20480), ("free", 20480), ("alloc", 20480), ("free", 20480), ("alloc", 8192)
    ]
    gaps = [(events[i + 1]["t_ns"] - events[i]["t_ns"]) / 1e9 for i in range(1, 4)]
    for gap in gaps:  # each op at its own time, not at the replay's
        assert 0.15 < gap < 0.6, gaps


def test_a_call_into_go_waits_for_a_replay_in_progress_on_another_thread(d: cc.Device) -> None:
    # Another thread's calls into Go (this one releases the GIL) replay the log while the main thread
    # closes a buffer and at once changes the strategy, which is refused while anything is allocated: it
    # must see the close even when the other thread has drained the log and not yet applied it.
    from cudacore._api import call, core

    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            call(core.Backend)

    t = threading.Thread(target=other)
    t.start()
    strategy = d.allocation_strategy
    refused = 0
    try:
        for _ in range(20000):
            d.allocate(4096).close()
            try:
                d.set_allocation_strategy(strategy)
            except cc.IllegalStateError:
                refused += 1
    finally:
        stop.set()
        t.join()
    assert refused == 0

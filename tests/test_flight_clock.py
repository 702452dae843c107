"""The flight recorder's timestamps are fine enough to plot a burst (issue 31): allocations microseconds
apart get distinct, increasing times, whether Go served them or the recycle log in C did, instead of all
sharing one millisecond tick."""

from __future__ import annotations

import itertools
import time

import cudacore as cc


def _burst_times(n: int, recycle: bool) -> tuple[list[int], int]:
    d = cc.Device(0)
    s = d.create_stream()
    try:
        if recycle:  # warm the block: later allocations of this size reuse it through the C log
            d.allocate(4096, stream=s).close()
        last = max((e["seq"] for e in cc.flight_record(device=0)), default=0)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            buf = d.allocate(4096, stream=s)
            if recycle:
                buf.close()
        span = time.perf_counter_ns() - t0
        d.synchronize()
        events = [e for e in cc.flight_record(device=0, after=last) if e["kind"] in ("alloc", "free")]
    finally:
        s.close()
    return [e["t_ns"] for e in events], span


def test_a_burst_of_allocations_gets_distinct_increasing_times() -> None:
    times, span = _burst_times(50, recycle=False)
    assert len(times) >= 50
    assert all(b > a for a, b in itertools.pairwise(times)), times
    assert times[-1] - times[0] < span + 1_000_000


def test_a_recycled_burst_gets_distinct_increasing_times() -> None:
    times, _ = _burst_times(50, recycle=True)
    assert len(times) >= 100
    assert all(b > a for a, b in itertools.pairwise(times)), times

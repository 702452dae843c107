"""What a graphed function's calls return (issue 31 item 3, "outputs the caller may keep"; docs/guide/capture.md).

``outputs="copy"`` (the default) returns fresh copies of the Buffers in the result, made on the graph's
stream after the launch, which later calls never touch; ``outputs="static"`` returns the graph's own
Buffers, which the next call overwrites. On the simulator the copies move real bytes, so the tests read
back what each kept result holds. Every test runs under the ``base`` leak check (streams, graphs, memory in
use back where they started) and checks ``in_use`` itself after closing the outputs.
"""

from __future__ import annotations

import threading
import warnings
from collections import namedtuple
from typing import Any

import numpy as np
import pytest

import cudacore as cc
from cudacore import testing

N = 64


def _read(b: cc.Buffer, s: cc.Stream) -> bytes:
    host = bytearray(b.size)
    b.copy_to(host, stream=s)
    s.synchronize()
    return bytes(host)


def _filled(dev: Any, s: cc.Stream, value: int, n: int = N) -> cc.Buffer:
    b = dev.allocate(n, stream=s)
    b.fill(value, stream=s)
    return b


@pytest.mark.parametrize("warmup", [0, 2])
def test_copy_outputs_stay_unchanged_after_later_calls(dev: Any, base: Any, warmup: int) -> None:
    """The hazard of make_graphed_callables: a result kept from call 1 changed at call 2. With the default
    outputs="copy" each call's result is a Buffer of its own, ordered on the stream, holding that call's
    output for good (warm-up calls, eager, return copies too)."""
    s = dev.create_stream()
    out = dev.allocate(N, stream=s)
    calls = []

    @cc.graphed(stream=s, warmup=warmup)
    def step(x: cc.Buffer) -> cc.Buffer:
        calls.append(s.capturing)
        cc.device_to_device(out, x, stream=s)
        return out

    assert step.outputs == "copy" and "outputs='copy'" in repr(step)
    xs = [_filled(dev, s, k) for k in range(1, 6)]  # the captured call's stays open: it is the graph's input
    baseline = dev.memory_stats()["in_use"]
    kept = [step(x) for x in xs]
    assert calls == [False] * warmup + [True], "warm-up calls, one capture, replays"
    assert step.graph is not None and not step.eager
    assert len({id(r) for r in kept}) == 5 and all(r is not out for r in kept)
    for k, r in enumerate(kept, 1):
        assert isinstance(r, cc.Buffer) and type(r) is cc.Buffer and r.size == N
        assert r.stream_handle == s.handle and r.device_id == dev.device_id
        assert _read(r, s) == bytes([k]) * N, f"call {k}'s result was overwritten by a later call"
    assert _read(out, s) == bytes([5]) * N, "the graph's own output holds the last call's"
    assert dev.memory_stats()["in_use"] == baseline + 5 * N, "one allocation per kept output, no more"
    kept[0].close()  # each is the caller's: closing one leaves the others
    assert _read(kept[1], s) == bytes([2]) * N
    for r in kept:
        r.close()
    s.synchronize()
    assert dev.memory_stats()["in_use"] == baseline, "the copies were the only memory the calls added"
    step.reset()
    for x in (*xs, out):
        x.close()
    s.close()


def test_static_outputs_are_the_graphs_own_and_overwritten(dev: Any, base: Any) -> None:
    """outputs="static": the documented overwrite. Every call returns the same Buffer, the graph's, which
    the next call's replay writes over; nothing is allocated or copied per call."""
    s = dev.create_stream()
    out = dev.allocate(N, stream=s)
    a, b = _filled(dev, s, 1), _filled(dev, s, 2)

    @cc.graphed(stream=s, outputs="static")
    def step(x: cc.Buffer) -> cc.Buffer:
        cc.device_to_device(out, x, stream=s)
        return out

    baseline = dev.memory_stats()["in_use"]
    first = step(a)
    assert first is out and _read(first, s) == bytes([1]) * N
    kept = bytes(_read(first, s))  # what a caller who keeps call 1's output must do: copy it out
    second = step(b)
    assert second is first is out
    assert _read(first, s) == bytes([2]) * N, "call 2 overwrote call 1's output, as documented"
    assert kept == bytes([1]) * N
    assert dev.memory_stats()["in_use"] == baseline, "static outputs allocate nothing per call"
    step.reset()
    for x in (a, b, out):
        x.close()
    s.close()


Pair = namedtuple("Pair", "buf label")


def test_copy_outputs_of_every_kind(dev: Any, base: Any) -> None:
    """A Buffer anywhere in the result (itself, in tuples, named tuples, lists, sets and dict values, a view)
    is replaced by a copy, once per distinct Buffer; the containers holding one are new, of the same type;
    None, numbers, strings, host objects and containers without a Buffer are returned as they are."""
    s = dev.create_stream()
    o1, o2 = dev.allocate(N, stream=s), dev.allocate(2 * N, stream=s)
    host = {"not": "copied"}
    plain = (1, 2)

    def kinds(x: cc.Buffer) -> Any:
        cc.device_to_device(o1, x, stream=s)
        cc.device_to_device(o2, x, stream=s, dst_offset=N)
        return (o1, 7, "text", None, host, plain, [o2, {"again": o1}], Pair(o2, "p"), frozenset({o1}), o2[N : 2 * N])

    g = cc.graphed(kinds, stream=s)
    xs = [_filled(dev, s, k) for k in (3, 4)]
    baseline = dev.memory_stats()["in_use"]
    results = [g(x) for x in xs]
    assert not g.eager
    for k, r in zip((3, 4), results, strict=True):
        b1, seven, text, none, h, p, lst, pair, fs, view = r
        assert type(r) is tuple and len(r) == 10
        assert (seven, text, none) == (7, "text", None) and h is host and p is plain
        assert b1 is not o1 and type(b1) is cc.Buffer and _read(b1, s) == bytes([k]) * N
        assert type(lst) is list and lst[1]["again"] is b1, "the same Buffer twice: one copy, found twice"
        assert lst[0] is not o2 and lst[0].size == 2 * N and _read(lst[0], s)[N:] == bytes([k]) * N
        assert type(pair) is Pair and pair.label == "p" and pair.buf is lst[0]
        assert type(fs) is frozenset and fs == frozenset({b1})
        assert type(view) is cc.Buffer and view.size == N and _read(view, s) == bytes([k]) * N, "a view: its bytes"
    assert _read(results[0][0], s) == bytes([3]) * N, "kept after the second call"
    n_copies = 3  # o1, o2, the view
    assert dev.memory_stats()["in_use"] == baseline + 2 * (N + 2 * N + N)
    for r in results:
        for b in (r[0], r[6][0], r[9]):
            b.close()
    s.synchronize()
    assert dev.memory_stats()["in_use"] == baseline, f"{n_copies} copies a call, all closed"

    # A result of None, or with no Buffer in it, is returned as it is (the same object).
    nothing = cc.graphed(lambda: None, stream=s)
    assert nothing() is None and nothing() is None
    same = {"loss": 1.5}
    scalars = cc.graphed(lambda: same, stream=s)
    assert scalars() is same and scalars() is same
    for w in (g, nothing, scalars):
        w.reset()
    for x in (*xs, o1, o2):
        x.close()
    s.close()


def test_copy_outputs_from_the_eager_fallbacks(dev: Any, base: Any) -> None:
    """A function that runs eagerly (its capture failed, or it returns memory it allocated) returns copies
    too, so what a call returns does not depend on whether the capture succeeded; the fallbacks are still
    recorded, and the Buffers the function allocated itself are freed once dropped."""
    s = dev.create_stream(non_blocking=False)  # a synchronous copy is illegal in its capture
    out = dev.allocate(N, stream=s)
    baseline = dev.memory_stats()["in_use"]

    def failing(k: int) -> cc.Buffer:
        out.copy_from(bytes([k]) * N)  # synchronous: the capture fails, and the function runs eagerly
        return out

    g = cc.graphed(failing, stream=s)
    kept = [g(k) for k in (1, 2, 3)]
    assert g.eager and g.fallback_reason is not None and g.fallback_reason.startswith("capture failed at ")
    assert len(g.fallbacks) == 1
    assert [_read(r, s) for r in kept] == [bytes([k]) * N for k in (1, 2, 3)], "eager results are kept too"
    assert all(r is not out for r in kept)
    for r in kept:
        r.close()

    src = _filled(dev, s, 9)

    @cc.graphed(stream=s)
    def allocating() -> tuple[cc.Buffer, int]:
        fresh = dev.allocate(N, stream=s)
        cc.device_to_device(fresh, src, stream=s)
        return fresh, 7

    made = [allocating() for _ in range(3)]
    assert allocating.eager and "keeps memory it allocated inside the capture" in (allocating.fallback_reason or "")
    for b, seven in made:
        assert seven == 7 and _read(b, s) == bytes([9]) * N
        b.close()
    src.close()
    s.synchronize()
    assert dev.memory_stats()["in_use"] == baseline, "the function's own Buffers were freed once the copies were made"

    static = cc.graphed(failing, stream=s, outputs="static")
    assert static(5) is out and static.eager, "static: an eager call returns what the function returns"
    for w in (g, allocating, static):
        w.reset()
    out.close()
    s.close()


def test_a_failed_copy_leaves_nothing_behind(dev: Any, base: Any) -> None:
    """If one output's copy cannot be allocated, the call raises the allocator's error and the copies made
    before it are closed: nothing leaks, and the next call works."""
    if cc.backend() != "sim":
        pytest.skip("fault injection is the simulator's")
    s = dev.create_stream()
    o1, o2 = _filled(dev, s, 1), _filled(dev, s, 2)
    g = cc.graphed(lambda: (o1, o2), stream=s)
    for r in g():
        r.close()
    s.synchronize()
    dev.release_cached_memory()
    baseline = dev.memory_stats()["in_use"]
    testing.fail_allocations(device=dev, nth=2)
    with pytest.raises(cc.OutOfMemoryError):
        g()
    testing.clear_faults()
    s.synchronize()
    assert dev.memory_stats()["in_use"] == baseline, "the first copy was closed"
    r1, r2 = g()
    assert (_read(r1, s), _read(r2, s)) == (bytes([1]) * N, bytes([2]) * N)
    for x in (r1, r2, o1, o2):
        x.close()
    g.reset()
    s.close()


def test_copy_outputs_of_calls_from_several_threads(dev: Any, base: Any) -> None:
    """Each call's input copies, launch and output copies are made in one turn: a thread's result is its
    own input's, never another thread's that ran in between."""
    s = dev.create_stream()
    out = dev.allocate(N, stream=s)

    @cc.graphed(stream=s)
    def step(x: cc.Buffer) -> cc.Buffer:
        cc.device_to_device(out, x, stream=s)
        return out

    x0 = _filled(dev, s, 0)  # the captured input, copied into at each later call
    step(x0).close()
    errors: list[BaseException] = []
    wrong: list[tuple[int, bytes]] = []

    def work(t: int) -> None:
        try:
            x = _filled(dev, s, t + 1)
            for _ in range(30):
                r = step(x)
                got = _read(r, s)
                if got != bytes([t + 1]) * N:
                    wrong.append((t, got[:4]))
                r.close()
            x.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not wrong
    s.synchronize()
    step.reset()
    out.close()
    x0.close()
    s.close()


class _ForeignArray:
    """Device memory of another library (here a stand-in): outputs="copy" cannot copy it."""

    def __init__(self, buf: cc.Buffer) -> None:
        self.buf = buf

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.buf.__cuda_array_interface__


def test_copy_mode_warns_of_device_arrays_it_cannot_copy(dev: Any, base: Any) -> None:
    s = dev.create_stream()
    out = dev.allocate(N, stream=s)
    arr = _ForeignArray(out)
    g = cc.graphed(lambda: (out, {"array": arr}), stream=s)
    with pytest.warns(UserWarning, match=r"returns memory that is not a cudacore Buffer \(result\[1\]\['array'\] ") as rec:
        r1, d1 = g()
    assert d1["array"] is arr and r1 is not out
    assert rec[0].filename == __file__, "the warning names the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r2, _ = g()  # once, at the capture
    pinned = dev.allocate_pinned(N)  # a graph's copy to the host: pinned memory it overwrites, not copied
    host = np.zeros(N, np.uint8)  # host memory of the caller's (numpy's __dlpack__ is the CPU's): no warning
    g2 = cc.graphed(lambda: (pinned, host), stream=s)
    with pytest.warns(UserWarning, match=r"\(result\[0\] \(cudacore._memory.PinnedBuffer\)\)"):
        p2, h2 = g2()
    assert p2 is pinned and h2 is host
    for r in (r1, r2):
        r.close()
    s.synchronize()
    g.reset()
    g2.reset()
    out.close()
    pinned.close()
    s.close()


@pytest.mark.parametrize("bad", ["copies", "COPY", "", None, 1, True])
def test_a_bad_outputs_value_is_refused_with_the_choices(dev: Any, bad: object) -> None:
    s = dev.create_stream()
    for make in (lambda: cc.graphed(lambda: None, stream=s, outputs=bad), lambda: cc.graphed(stream=s, outputs=bad)):  # type: ignore[call-overload]
        with pytest.raises(cc.InvalidValueError, match=r"cudacore.graphed: outputs must be one of 'copy', 'static', not ") as ei:
            make()
        assert isinstance(ei.value, ValueError) and ei.value.op == "cudacore.graphed"
    s.close()


def test_a_bad_capture_mode_is_refused_when_given(dev: Any) -> None:
    """Before, a bad mode only made the capture fail, and the function ran eagerly in silence."""
    s = dev.create_stream()
    with pytest.raises(cc.InvalidValueError, match=r"unknown capture mode 'globl': use one of 'thread_local', 'global', 'relaxed'"):
        cc.graphed(lambda: None, stream=s, mode="globl")  # type: ignore[call-overload]
    s.close()

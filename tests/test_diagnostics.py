"""Diagnostics (issue 14) and memory reports (issue 12 part 3): out-of-memory verdicts, the flight
recorder, memory_summary, allocation logging, Python stacks, capture rehearsal, escape audit, graphed
functions and the fork warning.

``sim`` tests model the conditions on the simulator (cudacore.testing.set_memory_conditions); the same
verdicts on the H100 are in test_diagnostics_gpu.py.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import pickle
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import cudacore as cc
from cudacore import interop, testing
from cudacore._native import fast

from conftest import ROOT, run_cli, run_python

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def dev():
    d = cc.Device(0)
    d.release_cached_memory()
    yield d
    if cc.backend() == "sim":
        testing.set_memory_conditions(0, {})
    d.memory_limit = None
    d.release_cached_memory()  # blocks cached on the tests' streams would read as used memory later


def _oom(fn) -> cc.OutOfMemoryError:
    with pytest.raises(cc.OutOfMemoryError) as info:
        fn()
    return info.value


# -- out-of-memory verdicts -------------------------------------------------------------------------------


@pytest.mark.sim
def test_verdict_exhausted_by_this_process(dev):
    held = [dev.allocate(10 * GiB) for _ in range(7)]
    try:
        e = _oom(lambda: dev.allocate(10 * GiB))
    finally:
        for b in held:
            b.close()
    assert e.cause == "exhausted"
    assert str(e).startswith("memory exhausted by this process: out of memory allocating 10.0 GiB on device 0")
    assert e.in_use == 70 * GiB
    assert "Free memory (close buffers you no longer need)" in str(e)


@pytest.mark.sim
def test_verdict_other_processes_by_nvml(dev):
    testing.set_memory_conditions(0, {"other_processes": [{"pid": 4242, "used": 50 * GiB}, {"pid": 77, "used": 10 * GiB}]})
    e = _oom(lambda: dev.allocate(30 * GiB))
    assert e.cause == "other_processes"
    msg = str(e)
    assert msg.startswith("memory held by other processes: out of memory allocating 30.0 GiB")
    assert "Other processes hold 60.0 GiB on this device (NVML): pid 4242 50.0 GiB, pid 77 10.0 GiB" in msg
    assert e.others == 60 * GiB
    assert e.fields["others_source"] == "nvml"


@pytest.mark.sim
def test_verdict_other_processes_by_gap_without_nvml(dev):
    testing.set_memory_conditions(0, {"other_processes": [{"pid": 4242, "used": 60 * GiB}], "no_nvml": True})
    e = _oom(lambda: dev.allocate(30 * GiB))
    assert e.cause == "other_processes"
    assert e.fields["others_source"] == "gap"
    # The gap includes the context's own reserve (about 527 MiB on the simulated H100).
    assert 60 * GiB < e.others < 61 * GiB
    assert "NVML was not available to tell them apart" in str(e)


@pytest.mark.sim
def test_small_gap_is_not_blamed_on_other_processes(dev):
    """Without NVML, the context's reserve alone (below 1 GiB) must not read as another process."""
    testing.set_memory_conditions(0, {"no_nvml": True})
    held = [dev.allocate(10 * GiB) for _ in range(7)]
    try:
        e = _oom(lambda: dev.allocate(10 * GiB))
    finally:
        for b in held:
            b.close()
    assert e.cause == "exhausted"


@pytest.mark.sim
def test_verdict_fragmentation_says_what_was_released(dev):
    cached = dev.allocate(1536 * MiB)
    cached.close()  # kept by the pool, too small to serve 2 GiB: Retry releases it
    testing.set_memory_conditions(0, {"max_block": 1 * GiB})
    e = _oom(lambda: dev.allocate(2 * GiB))
    assert e.cause == "fragmentation"
    msg = str(e)
    assert msg.startswith("fragmentation or cache: enough memory is free in total but not in one block")
    assert "no free block of 2.0 GiB exists" in msg
    assert e.released is not None and e.released >= 1536 * MiB
    assert f"released {cc._display.format_bytes(e.released)} of cached memory and retried" in msg
    assert e.free >= 2 * GiB


@pytest.mark.sim
def test_verdict_pool_reservation_refused(dev):
    testing.set_memory_conditions(0, {"pool_reservation_limit": 1 * GiB})
    e = _oom(lambda: dev.allocate(2 * GiB))
    assert e.cause == "pool_reservation"
    assert str(e).startswith("the driver refused the pool's reservation: out of memory allocating 2.0 GiB")
    assert 'set_allocation_strategy("sync")' in str(e)
    assert dev.memory_stats()["in_use"] == 0, "the probe's block was freed again"


@pytest.mark.sim
def test_pool_reservation_refused_works_with_sync(dev):
    """The fix the message gives works: the synchronous allocator gets the block."""
    testing.set_memory_conditions(0, {"pool_reservation_limit": 1 * GiB})
    dev.set_allocation_strategy("sync")
    try:
        with dev.allocate(2 * GiB) as b:
            assert b.size == 2 * GiB
    finally:
        dev.set_allocation_strategy("auto")


def test_verdict_limit(dev):
    dev.memory_limit = 1 * MiB
    e = _oom(lambda: dev.allocate(2 * MiB))
    assert e.cause == "limit"
    assert str(e).startswith("a cudacore memory limit was hit: out of memory allocating 2.0 MiB")
    assert e.limit == 1 * MiB


def test_verdict_too_large(dev):
    e = _oom(lambda: dev.allocate(dev.total_memory + 1))
    assert e.cause == "too_large"
    assert str(e).startswith("the request is larger than the device: out of memory")


@pytest.mark.sim
def test_memory_conditions_bad_input(dev):
    with pytest.raises(cc.InvalidValueError, match="JSON object"):
        testing.set_memory_conditions(0, {"bogus": 1})
    with pytest.raises(cc.InvalidValueError, match="do not fit"):
        testing.set_memory_conditions(0, {"other_processes": [{"pid": 1, "used": 200 * GiB}]})
    with pytest.raises(cc.InvalidValueError, match="pid"):
        testing.set_memory_conditions(0, {"other_processes": [{"pid": 0, "used": 1}]})
    with pytest.raises(cc.InvalidValueError, match="no device 9"):
        testing.set_memory_conditions(9, {})


def test_oom_pickles_with_cause_and_flight_record(dev):
    dev.memory_limit = 1 * MiB
    e = _oom(lambda: dev.allocate(2 * MiB))
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cc.OutOfMemoryError
    assert back.cause == "limit"
    assert str(back) == str(e)
    assert back.flight_record == e.flight_record
    assert back.flight_record[-1]["kind"] == "oom"


# -- the flight recorder --------------------------------------------------------------------------------


def test_recorder_records_alloc_free_oom_release_trim(dev):
    start = cc.flight_record(1)[-1]["seq"] if cc.flight_record(1) else 0
    b = dev.allocate(3 * MiB)
    ptr = b.ptr
    b.close()
    dev.memory_limit = 1 * MiB
    e = _oom(lambda: dev.allocate(2 * MiB))
    dev.memory_limit = None
    dev.release_cached_memory()
    evs = cc.flight_record(after=start)
    kinds = [x["kind"] for x in evs]
    assert kinds == ["alloc", "free", "oom", "release", "trim"]
    assert evs[0]["ptr"] == ptr and evs[0]["size"] == 3 * MiB and evs[0]["in_use"] == 3 * MiB
    assert evs[1]["ptr"] == ptr and evs[1]["in_use"] == 0
    assert evs[2]["note"] == "limit" and evs[2]["size"] == 2 * MiB
    assert evs[4]["size"] >= 3 * MiB, "the pool gave the 3 MiB block back"
    assert [x["seq"] for x in evs] == list(range(start + 1, start + 6))
    assert e.flight_record[-1]["seq"] == evs[2]["seq"], "the error carries the events up to itself"
    assert [x["t_ns"] for x in evs] == sorted(x["t_ns"] for x in evs)


def test_recorder_covers_the_pytorch_door(dev):
    lib = ctypes.CDLL(interop.extension_path())
    lib.cudacore_torch_alloc.restype = ctypes.c_void_p
    lib.cudacore_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_torch_free.restype = None
    lib.cudacore_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    p = lib.cudacore_torch_alloc(4096, 0, None)
    lib.cudacore_torch_free(p, 4096, 0, None)
    evs = cc.flight_record(2)
    assert [(x["kind"], x["ptr"], x["size"]) for x in evs] == [("alloc", p, 4096), ("free", p, 4096)]


def test_recorder_covers_tiles(dev):
    tiles = dev.allocate_tiles(3, 1 * MiB)
    ptrs = {t.ptr for t in tiles}
    for t in tiles:
        t.close()
    evs = cc.flight_record(6)
    assert [x["kind"] for x in evs] == ["alloc"] * 3 + ["free"] * 3
    assert {x["ptr"] for x in evs} == ptrs


def test_recorder_ring_is_bounded_and_can_be_turned_off(dev):
    before = cc.configure_flight_recorder()
    s = dev.create_stream()  # named by its int handle, nothing recycles: one event a slot
    try:
        cc.configure_flight_recorder(capacity=8)
        for _ in range(20):
            dev.allocate(256, stream=s.handle).close()
        evs = cc.flight_record()
        assert len(evs) == 8, "only the newest capacity events are kept"
        assert [x["seq"] for x in evs] == list(range(evs[0]["seq"], evs[0]["seq"] + 8))
        last = evs[-1]["seq"]
        assert cc.configure_flight_recorder(enabled=False)["enabled"] is False
        dev.allocate(256).close()
        assert cc.flight_record()[-1]["seq"] == last, "off: nothing recorded"
        # Recycled pairs on the legacy stream share a slot only when the free and the allocation carry the
        # same time; the recycle log's clock is fine enough to tell them apart, so the ring keeps 8 events
        # there too, each with its own time.
        cc.configure_flight_recorder(enabled=True)
        for _ in range(20):
            dev.allocate(256).close()
        evs = cc.flight_record()
        assert 8 <= len(evs) <= 128
        assert all(a["t_ns"] < b["t_ns"] for a, b in itertools.pairwise(evs)), "distinct, increasing times"
        assert [x["seq"] for x in evs] == list(range(evs[0]["seq"], evs[0]["seq"] + len(evs)))
        last = evs[-1]["seq"]
    finally:
        cc.configure_flight_recorder(enabled=True, capacity=before["capacity"])
        s.close()
    dev.allocate(256).close()
    assert cc.flight_record()[-1]["seq"] == last + 2


def test_recorder_bad_input():
    with pytest.raises(cc.InvalidValueError, match="positive"):
        cc.configure_flight_recorder(capacity=0)
    with pytest.raises(cc.InvalidValueError, match="capacity"):
        cc.configure_flight_recorder(capacity=1 << 21)
    with pytest.raises(TypeError):
        cc.configure_flight_recorder(capacity="8")  # type: ignore[arg-type]
    with pytest.raises(cc.InvalidValueError, match="after"):
        cc.flight_record(after=-1)
    with pytest.raises(ValueError, match="between 0 and 64"):
        cc.configure_flight_recorder(python_stacks=65)


def test_python_stacks_label_allocations(dev):
    cc.configure_flight_recorder(python_stacks=4)
    try:
        line = _line() + 1
        b = dev.allocate(4096)  # the label must name this line
        b.close()
    finally:
        cc.configure_flight_recorder(python_stacks=False)
    alloc = next(x for x in cc.flight_record(2) if x["kind"] == "alloc")
    first = alloc["note"].splitlines()[0]
    assert first == f"{__file__}:{line} in test_python_stacks_label_allocations"
    assert "cudacore/_" not in alloc["note"], "cudacore's own frames are left out"
    dev.allocate(4096).close()
    assert "note" not in cc.flight_record(2)[0], "off again: no label"


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_live_allocations_name_the_python_line(dev):
    dev.set_allocation_strategy("auto", track=True)
    try:
        line = _line() + 1
        b = dev.allocate(8192)
        live = dev.live_allocations()
        assert len(live) == 1
        assert live[0]["where"].splitlines()[0] == f"{__file__}:{line} in test_live_allocations_name_the_python_line"
        assert ".go:" not in live[0]["where"], "no Go stacks with the build machine's paths"
        b.close()
    finally:
        cc.configure_flight_recorder(python_stacks=False)
        dev.set_allocation_strategy("auto")



@pytest.mark.parametrize("progress", [None, lambda done, total: True], ids=["at-once", "in-batches"])
def test_tiles_name_the_python_line_as_allocate_does(dev, progress):
    """Tiles are made through Go, not the fast path that labels allocate()'s buffers: each still names
    the line of allocate_tiles, in live allocations and on its alloc event (issue 30 item 21)."""
    dev.set_allocation_strategy("auto", track=True)
    tiles = []
    try:
        after = cc.flight_record(1)[-1]["seq"] if cc.flight_record(1) else 0
        line = _line() + 1
        tiles = dev.allocate_tiles(3, 4096, progress=progress)
        want = f"{__file__}:{line} in test_tiles_name_the_python_line_as_allocate_does"
        live = {a["ptr"]: a["where"] for a in dev.live_allocations()}
        assert [live[t.ptr].splitlines()[0] for t in tiles] == [want] * 3
        events = {e["ptr"]: e for e in cc.flight_record(device=dev.device_id, after=after) if e["kind"] == "alloc"}
        assert [events[t.ptr]["note"].splitlines()[0] for t in tiles] == [want] * 3
    finally:
        for t in tiles:
            t.close()
        cc.configure_flight_recorder(python_stacks=False)
        dev.set_allocation_strategy("auto")

def test_oom_report_written_to_file(dev, tmp_path):
    path = tmp_path / "oom.txt"
    cc.configure_flight_recorder(path=path)
    try:
        dev.memory_limit = 1 * MiB
        e = _oom(lambda: dev.allocate(2 * MiB))
    finally:
        cc.configure_flight_recorder(path=None)
    text = path.read_text()
    assert "=== cudacore out of memory" in text
    assert str(e) in text
    assert "oom" in text and "cause limit" in text


def test_oom_report_file_from_environment(tmp_path):
    path = tmp_path / "env.txt"
    r = run_python(
        "import cudacore as cc\nd = cc.Device(0)\nd.memory_limit = 1024\n"
        "try:\n    d.allocate(4096)\nexcept cc.OutOfMemoryError as e:\n    print(e.cause)\n",
        env={"CUDACORE_BACKEND": "sim", "CUDACORE_FLIGHT_RECORD": str(path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "limit"
    assert "a cudacore memory limit was hit" in path.read_text()


def test_format_flight_record(dev):
    dev.allocate(1 * MiB).close()
    text = cc.format_flight_record(limit=2)
    lines = text.splitlines()
    assert lines[0] == "flight recorder: 2 events (times relative to the last)"
    assert " alloc " in lines[1] and "1.0 MiB" in lines[1]
    assert " free " in lines[2] and "(in use 0 B)" in lines[2]
    assert cc.format_flight_record([]) == "flight recorder: no events"


class _FakeAxes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        return lambda *a, **k: self.calls.append((name, a, k))


def test_plot_flight_record_draws_in_use_and_ooms(dev):
    dev.memory_limit = 1 * MiB
    b = dev.allocate(512 << 10)
    _oom(lambda: dev.allocate(1 * MiB))
    b.close()
    evs = cc.flight_record(3)
    ax = _FakeAxes()
    assert cc.plot_flight_record(evs, ax=ax) is ax
    step = [c for c in ax.calls if c[0] == "step"]
    assert len(step) == 1
    assert list(step[0][1][1]) == [0.5, 0.5, 0.0], "in use (MiB) after each event"
    scatter = [c for c in ax.calls if c[0] == "scatter"]
    assert len(scatter) == 1 and list(scatter[0][1][1]) == [0.5]
    assert not [c for c in ax.calls if c[0] == "axvline"], "no release among these events"
    dev.memory_limit = None
    dev.release_cached_memory()
    ax = _FakeAxes()
    cc.plot_flight_record(cc.flight_record(2), ax=ax)
    assert len([c for c in ax.calls if c[0] == "axvline"]) == 2, "the release and the trim are marked"


def test_plot_needs_matplotlib_only_without_an_axes():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="matplotlib"):
            cc.plot_flight_record([])


# -- memory_summary and logging ------------------------------------------------------------------------


def test_memory_summary(dev):
    b = dev.allocate(3 * MiB)
    try:
        text = cc.memory_summary(dev)
    finally:
        b.close()
    print(f"\ndiag: memory_summary ({cc.backend()}):\n{text}")
    assert text.splitlines()[1] == f"cudacore memory summary: device 0 ({dev.name})"
    assert "in use                     3.0 MiB" in text
    assert "live allocations: not tracked" in text
    assert "flight recorder:" in text and " alloc " in text
    assert cc.memory_summary(0).splitlines()[1] == text.splitlines()[1]


def test_memory_summary_lists_largest_tracked(dev):
    dev.set_allocation_strategy("auto", track=True)
    try:
        a, b = dev.allocate(1 * MiB), dev.allocate(5 * MiB)
        text = cc.memory_summary(dev, largest=1)
        a.close()
        b.close()
    finally:
        cc.configure_flight_recorder(python_stacks=False)
        dev.set_allocation_strategy("auto")
    assert "live allocations: 2 (largest 1)" in text
    live = [ln for ln in text.splitlines() if "at 0x" in ln and "test_diagnostics.py:" in ln]
    assert len(live) == 1 and live[0].lstrip().startswith("5.0 MiB at 0x"), "the largest, with its Python line"


def test_allocation_logging_is_opt_in(dev, caplog):
    caplog.set_level(logging.DEBUG, logger="cudacore")
    dev.allocate(4096).close()
    cc.log_allocations(False)
    assert not [r for r in caplog.records if r.name == "cudacore"], "off by default"
    cc.log_allocations(True, interval=0.01)
    try:
        b = dev.allocate(2 * MiB)
        b.close()
        dev.memory_limit = 1 * MiB
        _oom(lambda: dev.allocate(2 * MiB))
        dev.memory_limit = None
    finally:
        cc.log_allocations(False)  # logs what is left
    recs = [r for r in caplog.records if r.name == "cudacore"]
    kinds = [r.cudacore_event["kind"] for r in recs]
    assert kinds == ["alloc", "free", "oom"]
    assert recs[0].levelno == logging.DEBUG and "2.0 MiB" in recs[0].getMessage()
    assert recs[2].levelno == logging.WARNING and "cause limit" in recs[2].getMessage()


def test_allocation_logging_reports_lost_events(dev, caplog):
    caplog.set_level(logging.DEBUG, logger="cudacore")
    before = cc.configure_flight_recorder()["capacity"]
    s = dev.create_stream()  # named by its int handle, nothing recycles: one event a slot
    cc.configure_flight_recorder(capacity=4)
    try:
        cc.log_allocations(True, interval=60)  # no read until it is turned off
        for _ in range(5):
            dev.allocate(256, stream=s.handle).close()  # 10 events: 6 overwritten before the read
        cc.log_allocations(False)
    finally:
        cc.configure_flight_recorder(capacity=before)
        s.close()
    msgs = [r.getMessage() for r in caplog.records if r.name == "cudacore"]
    assert msgs[0] == "6 allocator events were lost (the flight recorder's ring wrapped)"
    assert len(msgs) == 5


# -- capture diagnostics ---------------------------------------------------------------------------------


def test_rehearse_names_the_first_illegal_line_not_the_symptom(dev):
    s = dev.create_stream(non_blocking=False)
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    lines = {}

    def body(st):
        buf.copy_from(pinned, stream=st)  # legal: captured
        lines["bad"] = _line() + 2
        try:
            buf.copy_to(bytearray(4096))  # synchronous on the legacy stream: refused (906)
        except cc.CaptureError:
            pass  # swallowed: the rehearsal still sees it
        lines["later"] = _line() + 1
        st.synchronize()  # a later error (900), the one that surfaces

    d = cc.rehearse(body, s)
    print(f"\ndiag: rehearse ({cc.backend()}):\n{d}")
    assert not d.ok
    assert d.first["where"] == f"{__file__}:{lines['bad']}"
    assert d.first["name"] == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
    assert d.first["op"] == "cudacore.copy_to"
    assert d.first["stack"][0] == f"{__file__}:{lines['bad']} in body"
    assert d.symptoms and d.symptoms[0]["where"] == f"{__file__}:{lines['later']}"
    assert isinstance(d.raised, cc.CaptureError) and d.raised.code == 900, "what surfaced was the symptom"
    assert f"first illegal operation, at {__file__}:{lines['bad']}" in str(d)
    assert not s.capturing
    s.synchronize()  # the stream works again
    buf.close()
    pinned.close()


def test_rehearse_clean_body(dev):
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    d = cc.rehearse(lambda st: buf.copy_from(pinned, stream=st), s)
    assert d.ok and d.first is None and d.escapes == []
    assert d.node_count == 1
    assert str(d) == "capture rehearsal: ok (1 nodes, nothing escaped)"
    buf.close()
    pinned.close()


def test_escape_audit_lists_work_outside_the_graph(dev):
    s = dev.create_stream(non_blocking=True)
    other = dev.create_stream()
    buf = dev.allocate(4096)
    pinned = dev.allocate_pinned(4096)
    with s.capture(mode="relaxed") as g:
        buf.copy_from(pinned, stream=s)  # captured
        buf.copy_from(bytes(4096))  # synchronous: runs now
        buf.copy_to(pinned, stream=other)  # on another stream: runs now
    print(f"\ndiag: escape audit ({cc.backend()}): {g.escapes}")
    assert g.node_count == 1
    assert g.escaped == 2
    assert g.escapes[0].startswith("copy_from (synchronous) on device 0")
    assert g.escapes[1].startswith("copy_to on stream 0x") and g.escapes[1].endswith(" of device 0")
    d = cc.rehearse(lambda st: buf.copy_from(bytes(4096)), s, mode="relaxed")
    assert not d.ok and d.first is None and len(d.escapes) == 1
    assert "escaped the capture" in str(d)
    for x in (buf, pinned):
        x.close()


def test_graphed_captures_once_then_replays(dev):
    s = dev.create_stream()
    src, dst = dev.allocate(4096, stream=s), dev.allocate(4096, stream=s)
    pin_in, pin_out = dev.allocate_pinned(4096), dev.allocate_pinned(4096)
    calls = []

    @cc.graphed(stream=s)
    def step() -> int:
        calls.append(1)
        src.copy_from(pin_in, stream=s)
        cc.device_to_device(dst, src, stream=s)
        dst.copy_to(pin_out, stream=s)
        return 7

    for k in range(3):
        pin_in.numpy()[:] = k + 1
        assert step() == 7
        s.synchronize()
        assert (pin_out.numpy() == k + 1).all(), "each call moved the data again"
    assert len(calls) == 1, "the Python body ran only to capture"
    assert step.graph is not None and step.graph.node_count == 3
    assert step.fallback_reason is None and not step.eager
    for x in (src, dst, pin_in, pin_out):
        x.close()
    step.reset()


def test_graphed_falls_back_to_eager_and_says_why(dev):
    s = dev.create_stream(non_blocking=False)
    buf = dev.allocate(4096, stream=s)
    out = bytearray(4096)
    calls = []

    def step() -> None:
        calls.append(1)
        step.line = _line() + 1  # type: ignore[attr-defined]
        buf.copy_from(bytes([len(calls)]) * 4096)  # synchronous: illegal in a capture
        buf.copy_to(out)

    g = cc.graphed(step, stream=s)
    g()
    print(f"\ndiag: graphed fallback ({cc.backend()}): {g.fallback_reason}")
    assert g.eager and isinstance(g.error, cc.CaptureError)
    assert g.fallback_reason.startswith(f"capture failed at {__file__}:{step.line}")  # type: ignore[attr-defined]
    assert bytes(out) == bytes([2]) * 4096, "the failed capture's call ran eagerly"
    g()
    assert bytes(out) == bytes([3]) * 4096 and len(calls) == 3
    assert "eager: capture failed" in repr(g)
    buf.close()


# -- fork ------------------------------------------------------------------------------------------------

_FAKE_LIBCUDA = """
static int inited;
int cuInit(unsigned flags) { (void)flags; inited = 1; return 0; }
int cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 1; return 0; }
"""


@pytest.mark.parametrize("init", [True, False])
def test_fork_child_error_says_the_driver_was_initialised(tmp_path, init):
    cc_bin = shutil.which("cc") or shutil.which("gcc")
    if cc_bin is None:
        pytest.skip("needs a C compiler to build a stand-in libcuda")
    src = tmp_path / "fake.c"
    src.write_text(_FAKE_LIBCUDA)
    lib = tmp_path / "libfakecuda.so"
    subprocess.run([cc_bin, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    code = textwrap.dedent(f"""
        import ctypes, os, sys
        fake = ctypes.CDLL({str(lib)!r}, mode=ctypes.RTLD_GLOBAL)
        if {init}:
            fake.cuInit(0)  # another library initialised the driver
        import cudacore as cc
        cc.Device(0).allocate(256).close()
        pid = os.fork()
        if pid == 0:
            try:
                cc.Device(0).allocate(256)
            except cc.IllegalStateError as e:
                print(e.fields["driver_at_fork"], str(e))
                sys.stdout.flush()
                os._exit(0)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    r = run_python(code, env={"CUDACORE_BACKEND": "sim", "CUDACORE_LIBCUDA": str(lib)})
    assert r.returncode == 0, r.stdout + r.stderr
    if init:
        assert r.stdout.startswith("2 ")
        assert "The CUDA driver was already initialised in the parent when it forked" in r.stdout
        assert "such as PyTorch, CuPy or Numba" in r.stdout
    else:
        assert r.stdout.startswith("1 ")
        assert "loaded in the parent, but not initialised" in r.stdout


def test_fork_without_driver_says_nothing_more():
    r = run_python(textwrap.dedent("""
        import os, sys
        import cudacore as cc
        cc.Device(0)
        pid = os.fork()
        if pid == 0:
            try:
                cc.Device(0).allocate(256)
            except cc.IllegalStateError as e:
                print(e.fields["driver_at_fork"], "initialised" in str(e))
                sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
    """), env={"CUDACORE_BACKEND": "sim", "CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0 False"



# -- doctor --verify -------------------------------------------------------------------------------------


def _probes(env: dict[str, str]) -> dict[str, dict]:
    r = run_cli(["doctor", "--verify", "--json"], env)
    assert r.returncode == 0, r.stderr
    [dev] = json.loads(r.stdout)["devices"]
    return {p["name"]: p for p in dev["probes"]}


def test_doctor_verify_on_the_simulated_h100():
    probes = _probes({"CUDACORE_BACKEND": "sim"})
    assert list(probes) == [
        "memory pool", "pinned host memory", "managed memory", "virtual memory", "IPC handle types", "peer access",
        "malloc heap reservation", "stack reservation", "printf fifo reservation", "module loading",
    ]
    assert probes["memory pool"] | {"reason": ""} == {"name": "memory pool", "claimed": True, "status": "verified", "reason": ""}
    assert probes["managed memory"]["status"] == "verified"
    for name in ("virtual memory", "IPC handle types", "peer access"):
        assert probes[name]["status"] == "not probed"
    stack = probes["stack reservation"]["value"]
    assert stack["resident_threads"] == 132 * 2048
    assert stack["cost_bytes"] == stack["bytes"] * 132 * 2048
    assert probes["module loading"]["value"]["mode"] == "LAZY"
    assert probes["module loading"]["status"] == "claimed"


def test_doctor_verify_text():
    r = run_cli(["doctor", "--verify"], {"CUDACORE_BACKEND": "sim", "CUDA_MODULE_LOADING": "eager"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # The probes follow the whole report (tests/test_doctor_report.py checks the report is all there).
    start = lines.index("verification (--verify): each capability exercised, not only read")
    assert lines[start + 2].split() == ["device", "0:", "probe", "claimed", "status"]
    assert any(ln.split()[:4] == ["memory", "pool", "yes", "verified"] for ln in lines)
    assert "reserves up to" in r.stdout and "(264.0 MiB)" in r.stdout
    assert "CUDA_MODULE_LOADING is set in the environment" in r.stdout


def test_doctor_verify_pools_unsupported_and_lying():
    tcc = [{"name": "sim-tcc", "total_memory": 1 << 30, "memory_pools_supported": False, "tcc_driver": True,
            "managed_memory": False}]
    probes = _probes({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": json.dumps(tcc)})
    assert probes["memory pool"]["claimed"] is False
    assert probes["memory pool"]["status"] == "unsupported"
    assert probes["managed memory"]["status"] == "unsupported"
    # A device whose attribute claims pools that the driver refuses (vGPU): the probe finds out.
    probes = _probes({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_FAULTS": "cuMemAllocFromPoolAsync:1:801"})
    pool = probes["memory pool"]
    assert pool["claimed"] is True and pool["status"] == "fallback"
    assert "CUDA_ERROR_NOT_SUPPORTED" in pool["reason"] and "synchronous allocator" in pool["reason"]


def test_doctor_verify_python_api():
    from cudacore import _verify

    report = _verify.verify(0)
    assert report["backend"] == cc.backend()
    assert report["devices"][0]["ordinal"] == 0
    assert "memory pool" in _verify.format_verify(report)
    with pytest.raises(cc.InvalidValueError):
        _verify.verify(7)


def test_doctor_verify_without_driver():
    r = run_cli(["doctor", "--verify"], {"CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 1
    assert r.stderr.startswith("cudacore doctor: no CUDA driver found.")
    assert "Traceback" not in r.stderr
    j = run_cli(["doctor", "--verify", "--json"], {"CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert j.returncode == 1
    assert json.loads(j.stdout)["error"]["type"] == "DriverNotFoundError"


def test_doctor_rejects_unknown_option():
    r = run_cli(["doctor", "--verfy"], {"CUDACORE_BACKEND": "sim"})
    assert r.returncode == 2
    assert "unrecognized arguments: --verfy" in r.stderr


def test_live_allocations_name_pytorch(dev):
    lib = ctypes.CDLL(interop.extension_path())
    lib.cudacore_torch_alloc.restype = ctypes.c_void_p
    lib.cudacore_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_torch_free.restype = None
    lib.cudacore_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    dev.set_allocation_strategy("auto", track=True)
    try:
        p = lib.cudacore_torch_alloc(4096, 0, None)
        [live] = dev.live_allocations()
        lib.cudacore_torch_free(p, 4096, 0, None)
    finally:
        cc.configure_flight_recorder(python_stacks=False)
        dev.set_allocation_strategy("auto")
    assert live["ptr"] == p and live["where"] == "PyTorch (cudacore.interop.torch_allocator)"


def test_docs_diagnostics_code_runs(capsys):
    """Every Python block of docs/guide/diagnostics.md runs, in order, in one namespace, on this backend."""
    text = (ROOT / "docs" / "guide" / "diagnostics.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 4
    ns: dict = {}
    for block in blocks:
        if "set_memory_conditions" in block and cc.backend() != "sim":
            continue
        exec(compile(block, "docs/guide/diagnostics.md", "exec"), ns)  # noqa: S102 - the documentation's own code
    out = capsys.readouterr().out
    assert "['alloc', 'free']" in out
    assert "cudacore.copy_to" in out and "capture rehearsal: FAILED" in out
    if cc.backend() == "sim":
        assert out.rstrip().endswith("other_processes")


def test_python_stacks_deep_recursion_is_cut_whole(dev):
    """64 frames of a deep stack do not fit the label: whole frames are kept, none cut in the middle."""

    def down(n: int) -> int:
        if n == 0:
            b = dev.allocate(256)
            p = b.ptr
            b.close()
            return p
        return down(n - 1)

    cc.configure_flight_recorder(python_stacks=64)
    try:
        ptr = down(80)
    finally:
        cc.configure_flight_recorder(python_stacks=False)
    [alloc] = [x for x in cc.flight_record(4) if x["kind"] == "alloc" and x["ptr"] == ptr]
    lines = alloc["note"].splitlines()
    assert 10 < len(lines) < 64, len(lines)
    assert all(ln == f"{__file__}:{ln.split(':')[1].split()[0]} in down" for ln in lines)
    assert len(alloc["note"]) < 2048


@pytest.mark.parametrize("progress", [None, True])
def test_tiles_oom_leads_with_the_verdict(dev, progress):
    dev.memory_limit = 10 * MiB
    kwargs = {} if progress is None else {"progress": lambda done, total: True}
    e = _oom(lambda: dev.allocate_tiles(20, 1 * MiB, **kwargs))
    assert e.cause == "limit"
    assert str(e).startswith("a cudacore memory limit was hit: allocated 10 of 20 tiles of 1.0 MiB"), str(e)
    assert e.flight_record and e.flight_record[-1]["kind"] in ("oom", "free")


def test_graphed_falls_back_when_work_escapes_or_an_error_is_swallowed(dev):
    s = dev.create_stream(non_blocking=True)
    buf = dev.allocate(4096, stream=s)
    out = bytearray(4096)
    n = []

    def escaping() -> None:
        n.append(1)
        buf.copy_from(bytes([len(n)]) * 4096)  # synchronous in a relaxed capture: runs now, not in the graph
        buf.copy_to(out)

    g = cc.graphed(escaping, stream=s, mode="relaxed")
    g()
    assert g.eager and g.graph is None and g.error is None
    assert g.fallback_reason.startswith("2 operation(s) escaped the capture and would not be replayed: copy_from (synchronous)")
    g()
    assert bytes(out) == bytes([3]) * 4096, "eager from then on: every call does the work"

    blocking = dev.create_stream(non_blocking=False)

    def swallowing() -> None:
        try:
            buf.copy_to(out)  # refused in the capture (906), and swallowed
        except cc.CaptureError:
            pass

    g2 = cc.graphed(swallowing, stream=blocking)
    g2()
    assert g2.eager
    assert g2.fallback_reason.startswith(f"an illegal operation was left out of the capture at {__file__}:")
    buf.close()


def test_recorder_and_logging_under_threads(dev, caplog):
    """Threads allocating at once while the log reader drains: every event is logged once, in order."""
    import threading

    caplog.set_level(logging.DEBUG, logger="cudacore")
    start = cc.flight_record(1)[-1]["seq"] if cc.flight_record(1) else 0
    cc.log_allocations(True, interval=0.001)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(300):
                dev.allocate(4096).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cc.log_allocations(False)
    assert not errors
    seqs = [r.cudacore_event["seq"] for r in caplog.records if r.name == "cudacore" and hasattr(r, "cudacore_event")]
    assert seqs == list(range(start + 1, start + 1 + 2400)), "each of the 2,400 events logged once, in order"


def test_go_stacks_after_writes_every_goroutine_unless_disarmed() -> None:
    from conftest import run_python

    r = run_python(
        "import time\nfrom cudacore import testing\n"
        "testing.go_stacks_after(0.05)\ntime.sleep(0.5)\n"
        "testing.go_stacks_after(0.2)\ntesting.go_stacks_after(None)\ntime.sleep(0.5)\nprint('done')\n",
        {"CUDACORE_BACKEND": "sim"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"
    assert r.stderr.count("cudacore: the stacks of every goroutine") == 1, r.stderr[-2000:]
    assert "goroutine " in r.stderr
    if sys.platform == "linux":  # then the threads, each with its state, from /proc
        assert r.stderr.count("cudacore: the threads of the process") == 1, r.stderr[-2000:]
        assert re.search(r"thread \d+ .* state [A-Z] .* cpu \d+", r.stderr), r.stderr[-2000:]


@pytest.mark.parametrize(("bad", "exc"), [("1", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError)])
def test_go_stacks_after_checks_its_argument(bad: object, exc: type[Exception]) -> None:
    from cudacore import testing

    with pytest.raises(exc, match="go_stacks_after"):
        testing.go_stacks_after(bad)  # type: ignore[arg-type]


def test_escape_audit_ignores_other_threads_work(dev):
    """Issue 30 item 12: another thread's copies on its own stream (and its synchronous ones) while a
    capture runs are not escapes of that capture: rehearse reports a clean body as ok, and graphed keeps
    the graph."""
    import threading
    import time

    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    stop, busy = threading.Event(), threading.Event()

    def noise() -> None:
        u = dev.create_stream()
        b = dev.allocate(4096, stream=u)
        while not stop.is_set():
            b.copy_from(bytes(4096), stream=u)
            b.copy_from(bytes(4096))
            busy.set()
        b.close()
        u.close()

    t = threading.Thread(target=noise)
    t.start()
    try:
        busy.wait()
        def body(st: cc.Stream) -> None:
            buf.copy_from(pinned, stream=st)
            time.sleep(0.005)  # the other thread runs while this one captures

        for _ in range(5):
            d = cc.rehearse(body, s)
            assert d.ok, str(d)
            g = cc.graphed(lambda: body(s), stream=s)
            g()
            g()
            assert not g.eager and g.graph is not None, g.fallback_reason
            g.reset()
    finally:
        stop.set()
        t.join()
    s.synchronize()
    buf.close()
    pinned.close()


def test_rehearse_refuses_a_stream_that_captures_and_leaves_its_capture(dev):
    """Issue 30 item 9: rehearsing on a stream the caller is capturing is refused up front; the caller's
    capture goes on and ends with its work."""
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    ran = []
    with s.capture() as g:
        buf.copy_from(pinned, stream=s)
        with pytest.raises(cc.IllegalStateError, match="capturing already") as ei:
            cc.rehearse(lambda st: ran.append(st), s)
        assert ei.value.op == "cudacore.rehearse"
        assert s.capturing, "the caller's capture goes on"
    assert not ran, "the body never ran"
    assert g.node_count == 1
    g.launch(s)
    s.synchronize()
    g.destroy()
    buf.close()
    pinned.close()


def test_rehearse_names_an_exception_of_the_body(dev):
    """Issue 30 item 10: an ordinary exception of the body is named, with its line, not reported as
    escaped work; the report keeps the exception itself."""
    s = dev.create_stream()

    def body(st):
        raise ValueError("the body's own bug")

    line = body.__code__.co_firstlineno + 1
    d = cc.rehearse(body, s)
    assert not d.ok and d.first is None and d.escapes == []
    assert isinstance(d.raised, ValueError) and d.raised.__traceback__ is not None
    text = str(d)
    assert text.splitlines()[0] == "capture rehearsal: FAILED"
    assert f"the body raised ValueError, at {__file__}:{line}: the body's own bug" in text
    assert "escaped" not in text
    assert not s.capturing
    s.close()


def test_graphed_function_that_calls_itself_does_not_hang(dev):
    """Issue 30 item 11: a graphed function that calls itself runs the inner call as part of the outer
    one (captured with it, replayed with it), instead of deadlocking on the wrapper's lock."""
    import threading

    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    calls = []

    @cc.graphed(stream=s)
    def rec(n: int = 2) -> None:
        calls.append(n)
        buf.copy_from(pinned, stream=s)
        if n:
            rec(n - 1)
        if n == 1:
            with pytest.raises(cc.IllegalStateError, match="from inside its own call"):
                rec.reset()

    out: dict = {}

    def run() -> None:
        try:
            rec()
            rec()
            out["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the graphed function deadlocked on its own call"
    assert out == {"ok": True}
    assert calls == [2, 1, 0], "captured once, with its inner calls; the second call replays"
    assert not rec.eager and rec.graph.node_count == 3
    s.synchronize()
    rec.reset()
    buf.close()
    pinned.close()


def test_graphed_function_that_returns_memory_it_allocated_runs_eagerly(dev):
    """Issue 30 item 13: a graph cannot be launched again while its last launch's memory is open, so a
    function that returns (or keeps) a Buffer it allocated inside the capture runs eagerly, and each call
    returns its own valid Buffer, which the caller owns."""
    s = dev.create_stream()
    src = dev.allocate(256, stream=s)
    src.copy_from(bytes(range(256)), stream=s)

    @cc.graphed(stream=s)
    def make() -> tuple[cc.Buffer, int]:
        out = dev.allocate(256, stream=s)
        cc.device_to_device(out, src, stream=s)
        return out, 7

    results = [make() for _ in range(3)]
    assert make.eager and make.graph is None and make.error is None
    assert "keeps memory it allocated inside the capture" in make.fallback_reason
    bufs = [b for b, _ in results]
    assert len({id(b) for b in bufs}) == 3
    bufs[0].close()  # each is the caller's own: closing one leaves the others, and later calls, valid
    later, seven = make()
    for b in (*bufs[1:], later):
        assert not b.closed
        host = bytearray(256)
        b.copy_to(host, stream=s)
        s.synchronize()
        assert bytes(host) == bytes(range(256))
        b.close()
    assert seven == 7

    # Memory allocated and closed inside the function is a temporary of the graph: it stays graphed.
    @cc.graphed(stream=s)
    def temp() -> None:
        t = dev.allocate(256, stream=s)
        cc.device_to_device(t, src, stream=s)
        t.close()

    temp()
    temp()
    assert not temp.eager and temp.graph is not None
    s.synchronize()
    temp.reset()
    src.close()


@pytest.mark.parametrize("bad", [0, "s", object()])
def test_rehearse_and_graphed_refuse_what_is_not_a_stream(bad):
    """Issue 30 item 20: a TypeError naming what is accepted, not an AttributeError."""
    with pytest.raises(TypeError, match=r"cudacore.rehearse: stream must be a cudacore.Stream \(or None, for a new stream\), not "):
        cc.rehearse(lambda st: None, bad)
    with pytest.raises(TypeError, match=r"cudacore.graphed: stream must be a cudacore.Stream, not "):
        cc.graphed(lambda: None, stream=bad)
    with pytest.raises(TypeError, match="cudacore.graphed: stream must be"):
        cc.graphed(stream=bad)


def test_rehearse_and_graphed_say_how_to_capture_for_another_library(dev):
    """Issue 31: stream= takes another library's stream wherever cudacore only orders work on it; a capture
    runs on a Stream of cudacore's, and the refusal of a __cuda_stream__ object says how to get one."""
    s = dev.create_stream()

    class Foreign:
        def __cuda_stream__(self):
            return s.__cuda_stream__()

    hint = r"a capture runs on a stream of cudacore's; create one with Device.create_stream\(\)"
    with pytest.raises(TypeError, match=r"cudacore.graphed: stream must be a cudacore.Stream, not Foreign: " + hint):
        cc.graphed(lambda: None, stream=Foreign())
    with pytest.raises(TypeError, match=r"cudacore.rehearse: .*, not Foreign: " + hint):
        cc.rehearse(lambda st: None, Foreign())
    s.close()


def test_graphed_copies_later_inputs_into_the_captured_ones_and_refuses_other_shapes(dev):
    """Issue 31 item 3: a later call's Buffers are copied into the captured call's (static inputs) before
    the replay, instead of the replay silently working on the first call's; a Buffer of another size, another
    baked-in value or another call shape is refused."""
    s = dev.create_stream()
    a, b, out = dev.allocate(64, stream=s), dev.allocate(64, stream=s), dev.allocate(64, stream=s)
    a.fill(1)
    b.fill(2)
    calls = []

    @cc.graphed(stream=s, outputs="static")  # the graph's own output, to watch it (tests/test_graphed_outputs.py: "copy")
    def step(x: cc.Buffer, k: int = 0) -> cc.Buffer:
        calls.append(k)
        cc.device_to_device(out, x, stream=s)
        return out

    def result() -> bytes:
        host = bytearray(64)
        out.copy_to(host)
        return bytes(host)

    assert step(a, 0) is out and result() == b"\x01" * 64
    step(b, 0)  # used to return a's result again
    s.synchronize()
    assert result() == b"\x02" * 64, "b was copied into the captured input"
    b.fill(3)
    step(b, 0)
    s.synchronize()
    assert result() == b"\x03" * 64
    assert len(calls) == 1 and not step.eager
    with dev.allocate(32) as small, pytest.raises(cc.InvalidValueError, match="static input of 64 bytes .* passes 32 bytes"):
        step(small, 0)
    with pytest.raises(cc.InvalidValueError, match="was 0 when captured and is 5 now"):
        step(a, 5)
    with pytest.raises(cc.InvalidValueError, match="captured with 2 positional argument"):
        step(a)
    s.synchronize()
    step.reset()
    for x in (a, b, out):
        x.close()


def test_graphed_warms_up_and_records_every_fallback(dev):
    """Issue 31 item 3: warmup=N runs N eager calls before the capture; every fallback to eager is kept,
    with its reason, in .fallbacks."""
    s = dev.create_stream()
    buf = dev.allocate(64, stream=s)
    pinned = dev.allocate_pinned(64)
    calls = []

    def body() -> None:
        calls.append(s.capturing)
        buf.copy_from(pinned, stream=s)

    g = cc.graphed(body, stream=s, warmup=2)
    for _ in range(4):
        g()
    assert calls == [False, False, True], "two eager warm-up calls, then the capture; the fourth call replays"
    assert g.graph is not None and g.fallbacks == []
    with pytest.raises(TypeError, match="warmup must be an int >= 0"):
        cc.graphed(body, stream=s, warmup=-1)

    blocking = dev.create_stream(non_blocking=False)

    def bad() -> None:
        buf.copy_to(bytearray(64))  # synchronous: illegal in the capture

    g2 = cc.graphed(bad, stream=blocking)
    g2()
    g2.reset()
    g2()
    assert len(g2.fallbacks) == 2 and all(r.startswith("capture failed at ") for r in g2.fallbacks)
    s.synchronize()
    g.reset()
    buf.close()
    pinned.close()


def test_rehearse_of_a_body_that_closes_its_stream_reports_it(dev):
    # The body's close discarded the capture: rehearse reports what the body raised instead of failing in
    # its own cleanup on the closed stream.
    for given in (None, dev.create_stream()):
        r = cc.rehearse(lambda s: s.close(), given)
        assert not r.ok
        assert isinstance(r.raised, cc.CUDAError)
    assert not fast.capturing()

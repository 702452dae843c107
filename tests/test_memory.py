"""Memory: buffers, out of memory that never crashes, tiles, statistics, limits, pinned memory."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
from typing import Any

import numpy as np
import pytest

import cudacore as cc

from conftest import run_python

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def dev() -> cc.Device:
    d = cc.Device(0)
    d.memory_limit = None
    d.release_cached_memory()
    yield d
    d.memory_limit = None
    assert d.memory_stats()["in_use"] == 0, "a test leaked device memory"


def test_buffer_lifecycle(dev: cc.Device) -> None:
    gc.collect()  # earlier tests' garbage (a Buffer in a reference cycle) must not count below
    base = dev.memory_stats()["in_use"]
    buf = dev.allocate(MiB)
    assert isinstance(buf, cc.Buffer)
    assert buf.size == buf.nbytes == MiB and buf.device is dev and not buf.closed
    assert buf.ptr > 0 and f"0x{buf.ptr:x}" in repr(buf)
    assert dev.memory_stats()["in_use"] == base + MiB
    buf.close()
    buf.close()  # idempotent: never a double free
    assert buf.closed and "closed" in repr(buf)
    with pytest.raises(cc.InvalidHandleError, match="closed"):
        _ = buf.ptr
    with dev.allocate(256) as b2:
        assert b2.size == 256
    assert b2.closed
    stats = dev.memory_stats()
    assert stats["in_use"] == base and stats["frees"] >= 2


def test_garbage_collected_buffer_is_freed(dev: cc.Device) -> None:
    before = dev.memory_stats()["frees"]
    buf = dev.allocate(4 * MiB)
    del buf
    gc.collect()
    stats = dev.memory_stats()
    assert stats["in_use"] == 0 and stats["frees"] == before + 1


def test_cuda_array_interface_v3(dev: cc.Device) -> None:
    with dev.allocate(1000) as buf:
        cai = buf.__cuda_array_interface__
        assert cai == {"shape": (1000,), "typestr": "|u1", "data": (buf.ptr, False), "strides": None, "version": 3, "stream": 1}


@pytest.mark.parametrize(("size", "exc"), [(0, cc.InvalidValueError), (-1, cc.InvalidValueError), ("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError)])
def test_bad_sizes(dev: cc.Device, size: object, exc: type) -> None:
    with pytest.raises(exc):
        dev.allocate(size)  # type: ignore[arg-type]
    assert dev.memory_stats()["in_use"] == 0


@pytest.mark.parametrize(("stream", "exc"), [("s", TypeError), (-3, cc.InvalidValueError), (1.5, TypeError)])
def test_bad_streams(dev: cc.Device, stream: object, exc: type) -> None:
    with pytest.raises(exc):
        dev.allocate(256, stream=stream)


def test_out_of_memory_is_typed_explains_and_leaves_memory_as_it_was(dev: cc.Device) -> None:
    free_before, total = dev.memory_info()
    in_use_before = dev.memory_stats()["in_use"]
    with pytest.raises(cc.OutOfMemoryError) as info:
        dev.allocate(2 * total)
    e = info.value
    print(f"\nOutOfMemoryError as a user sees it ({cc.backend()}):\n  {type(e).__name__}: {e}")
    assert isinstance(e, MemoryError) and e.code == 2 and e.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert e.requested == 2 * total and e.total == total and e.device == 0
    assert e.free is not None and e.free <= total
    text = str(e)
    assert "out of memory allocating" in text and "device 0" in text and "free" in text
    assert "larger than the device's total memory" in text
    assert dev.memory_stats()["in_use"] == in_use_before
    assert dev.memory_info()[0] >= free_before - MiB
    assert dev.memory_stats()["ooms"] >= 1


def test_allocate_until_out_of_memory_then_free_and_allocate_again(dev: cc.Device) -> None:
    chunk = dev.total_memory // 8
    held = []
    with pytest.raises(cc.OutOfMemoryError) as info:
        for _ in range(16):
            held.append(dev.allocate(chunk))
    assert 6 <= len(held) <= 8
    assert info.value.in_use == len(held) * chunk
    for b in held:
        b.close()
    again = dev.allocate(chunk)  # the device is fully usable after out of memory
    again.close()


def test_tiles_all_or_nothing_leaves_memory_exactly_as_before(dev: cc.Device) -> None:
    dev.release_cached_memory()
    free_before = dev.memory_info()[0]
    stats_before = dev.memory_stats()
    tile = 4 * GiB
    count = dev.total_memory // tile + 4
    with pytest.raises(cc.OutOfMemoryError) as info:
        dev.allocate_tiles(count, tile)
    e = info.value
    fitted = int(e.fields["tiles_allocated"])
    print(f"\ntiled allocation failure ({cc.backend()}): {e}")
    assert 0 < fitted < count
    assert f"allocated {fitted} of {count} tiles" in str(e)
    assert int(e.fields["tiles_fit"]) >= fitted - 1
    after = dev.memory_stats()
    assert abs(dev.memory_info()[0] - free_before) <= MiB
    assert after["in_use"] == stats_before["in_use"] == 0
    assert after["allocations"] - stats_before["allocations"] == fitted
    assert after["frees"] - stats_before["frees"] == fitted


def test_tiles_success_progress_and_cancel(dev: cc.Device) -> None:
    seen: list[tuple[int, int]] = []
    tiles = dev.allocate_tiles(250, MiB, progress=lambda done, total: seen.append((done, total)))
    assert len(tiles) == 250 and len({t.ptr for t in tiles}) == 250
    assert seen[-1] == (250, 250) and len(seen) == 84  # batches of ceil(250 / 100) tiles
    assert dev.memory_stats()["in_use"] == 250 * MiB
    for t in tiles:
        t.close()
    with pytest.raises(InterruptedError):
        dev.allocate_tiles(100, MiB, progress=lambda done, total: done < 50)
    assert dev.memory_stats()["in_use"] == 0
    tiles = dev.allocate_tiles(3, 1000)
    assert [t.size for t in tiles] == [1000] * 3
    for t in tiles:
        t.close()


@pytest.mark.parametrize(("count", "size", "exc"), [(0, 1, cc.InvalidValueError), (1, 0, cc.InvalidValueError), (-2, 5, cc.InvalidValueError), (1.5, 5, TypeError), (2, "x", TypeError)])
def test_tiles_bad_input(dev: cc.Device, count: object, size: object, exc: type) -> None:
    with pytest.raises(exc):
        dev.allocate_tiles(count, size)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dev.allocate_tiles(2, 5, progress="yes")


def test_tiles_progress_bar_without_tqdm_is_a_clear_error(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30 item 20: progress=True without tqdm is an InvalidValueError that says to install tqdm or
    pass progress=False, raised before anything is allocated."""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    before = dev.memory_stats()["in_use"]
    with pytest.raises(cc.InvalidValueError, match=r"pip install tqdm\), or pass progress=False") as ei:
        dev.allocate_tiles(4, MiB, progress=True)
    assert ei.value.op == "cudacore.allocate_tiles"
    assert isinstance(ei.value.__cause__, ImportError)
    assert dev.memory_stats()["in_use"] == before


def test_would_fit_counts_free_and_cache(dev: cc.Device) -> None:
    assert dev.would_fit(1, MiB)
    assert not dev.would_fit(1, 2 * dev.total_memory)
    assert dev.would_fit(4, dev.memory_info()[0] // 8)


def test_memory_stats_counters_and_peak(dev: cc.Device) -> None:
    s0 = dev.memory_stats()
    a, b = dev.allocate(3 * MiB), dev.allocate(5 * MiB)
    s1 = dev.memory_stats()
    assert s1["in_use"] == 8 * MiB
    assert s1["peak_in_use"] >= 8 * MiB
    assert s1["allocations"] == s0["allocations"] + 2
    a.close()
    b.close()
    s2 = dev.memory_stats()
    assert s2["in_use"] == 0 and s2["frees"] == s0["frees"] + 2
    assert s2["cached"] >= 8 * MiB, "freed pool blocks stay cached for reuse"
    assert dev.reset_peak_memory_stats() == 0
    assert dev.memory_stats()["peak_in_use"] == 0
    assert dev.release_cached_memory() == 0
    assert set(s2) >= {"in_use", "peak_in_use", "cached", "reserved", "allocations", "frees", "ooms", "limit", "strategy"}


def test_memory_limit(dev: cc.Device) -> None:
    dev.memory_limit = 4 * MiB
    assert dev.memory_limit == 4 * MiB
    keep = dev.allocate(3 * MiB)
    with pytest.raises(cc.OutOfMemoryError) as info:
        dev.allocate(2 * MiB)
    assert info.value.limit == 4 * MiB and "limit" in str(info.value)
    keep.close()
    dev.allocate(4 * MiB).close()
    dev.memory_limit = None
    assert dev.memory_limit is None
    with pytest.raises(cc.InvalidValueError):
        dev.memory_limit = -1
    with pytest.raises(TypeError):
        dev.memory_limit = "1 GiB"  # type: ignore[assignment]


def test_pinned_buffer(dev: cc.Device) -> None:
    np = pytest.importorskip("numpy")
    h = dev.allocate_pinned(4096)
    assert isinstance(h, cc.PinnedBuffer) and len(h) == 4096
    arr = h.numpy()
    arr[:] = 7
    assert bytes(memoryview(h)[:3]) == b"\x07\x07\x07"
    assert dev.memory_stats()["pinned_in_use"] == 4096
    with pytest.raises(BufferError, match="view"):
        h.close()
    del arr
    h.close()
    h.close()
    with pytest.raises(cc.InvalidHandleError):
        memoryview(h)
    assert dev.memory_stats()["pinned_in_use"] == 0
    with pytest.raises(cc.InvalidValueError):
        dev.allocate_pinned(0)
    assert np.frombuffer(dev.allocate_pinned(16), dtype=np.uint32).shape == (4,)


def test_synchronous_copies_with_pinned_memory(dev: cc.Device) -> None:
    # stream=None with a PinnedBuffer takes the C hot case: bytes arrive, sizes are the general path's,
    # and a closed PinnedBuffer gets the general path's error.
    src, out = dev.allocate_pinned(4096), dev.allocate_pinned(4096)
    memoryview(src)[:] = bytes(range(256)) * 16
    with dev.allocate(8192) as b:
        b.copy_from(src, nbytes=4096)  # the first 4 KiB of b (another size needs nbytes=)
        b.copy_to(bytearray(8192))
        small = dev.allocate_pinned(1024)
        with pytest.raises(cc.InvalidValueError):
            b.copy_to(small)  # 8 KiB do not fit in 1 KiB
        with pytest.raises(cc.InvalidValueError, match="the source holds 4096 bytes and the buffer 8192"):
            b.copy_from(src)  # a size mismatch is refused, never a partial copy
        with dev.allocate(4096) as c:
            c.copy_from(src)
            c.copy_to(out)
        assert bytes(memoryview(out)) == bytes(memoryview(src))
        small.close()
        with pytest.raises(cc.CUDAError) as ei:
            b.copy_from(small)
        assert ei.value.name == "CUDACORE_ERROR_CLOSED"
    src.close()
    out.close()


def test_many_threads_allocate_at_once(dev: cc.Device) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(300):
                size = 256 + (seed * 7919 + i * 104729) % (2 * MiB)
                with dev.allocate(size) as b:
                    assert b.size == size
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert dev.memory_stats()["in_use"] == 0


def test_strategy_change_refused_while_allocated_and_tracking(dev: cc.Device) -> None:
    keep = dev.allocate(MiB)
    with pytest.raises(cc.IllegalStateError, match="close those buffers"):
        dev.set_allocation_strategy("sync")
    keep.close()
    try:
        dev.set_allocation_strategy("sync", track=True)
        assert dev.allocation_strategy == "sync" and "requested explicitly" in dev.allocation_strategy_reason
        b = dev.allocate(1234)
        live = dev.live_allocations()
        assert [(a["ptr"], a["size"]) for a in live] == [(b.ptr, 1234)]
        b.close()
        assert dev.live_allocations() == []
        with pytest.raises(cc.InvalidValueError):
            dev.set_allocation_strategy("fastest")
    finally:
        dev.set_allocation_strategy("auto")
    assert dev.allocation_strategy == ("pool" if dev.memory_pools_supported and not dev.tcc_driver else "sync")


FALLBACK = """
import json, cudacore as cc
d = cc.Device(0)
bufs = [d.allocate(1 << 20) for _ in range(4)]
s = d.memory_stats()
for b in bufs:
    b.close()
try:
    d.allocate(2 * d.total_memory)
except cc.OutOfMemoryError as e:
    oom = str(e)
print(json.dumps([d.allocation_strategy, s["in_use"], d.memory_stats()["in_use"], oom]))
"""


@pytest.mark.parametrize(
    "config",
    [
        {"name": "sim-tcc", "total_memory": GiB, "memory_pools_supported": False, "tcc_driver": True},
        {"name": "sim-wsl", "total_memory": GiB, "memory_pools_supported": False},
    ],
)
def test_fallback_allocator_on_devices_without_pools(config: dict) -> None:
    r = run_python(FALLBACK, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": json.dumps([config])})
    assert r.returncode == 0, r.stderr
    strategy, in_use, after, oom = json.loads(r.stdout)
    assert (strategy, in_use, after) == ("sync", 4 << 20, 0)
    assert "cuMemAlloc_v2" in oom and "out of memory allocating 2.0 GiB" in oom


def test_retry_after_injected_out_of_memory() -> None:
    code = (
        "import cudacore as cc\n"
        "d = cc.Device(0)\n"
        "b = d.allocate(1 << 20)\n"
        "s = d.memory_stats()\n"
        "print(b.size, s['allocations'], s['ooms'])\n"
    )
    env = {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_FAULTS": "cuMemAllocFromPoolAsync:1:2"}
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1048576", "1", "0"], "the first pool allocation failed, was retried and succeeded"
    env["CUDACORE_SIM_FAULTS"] = "cuMemAllocFromPoolAsync:1:2,cuMemAllocFromPoolAsync:2:2"
    r = run_python(code.replace("b = d.allocate(1 << 20)", "try:\n    d.allocate(1 << 20)\nexcept cc.OutOfMemoryError as e:\n    print('OOM', e.requested)\nb = d.allocate(1 << 20)"), env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "OOM 1048576", "two failures in a row: retried once, then reported"


def test_buffer_outlives_its_stream(dev: cc.Device) -> None:
    """Closing a stream before its buffers must not hand the driver a dead stream handle: on the H100 the
    real driver segfaulted when the cache later freed a block on it. The free goes to the legacy stream."""
    s = dev.create_stream()
    a = dev.allocate(MiB, stream=s)
    b = dev.allocate(3 * MiB, stream=s)
    a.close()  # cached on s, given back when s is destroyed
    s.close()
    b.close()  # recorded against s, which is gone
    with pytest.raises(cc.InvalidHandleError, match="was destroyed"):
        dev.allocate(256, stream=s.handle)
    dev.release_cached_memory()
    assert dev.memory_stats()["in_use"] == 0


RELEASE_AT_EXIT = """
import atexit, os, sys

parent = os.getpid()

def after_cudacore():  # registered first, so it runs after cudacore's own exit handler
    if os.getpid() != parent:
        return
    d = cc.Device(0)
    print("cached at exit", d.memory_stats()["cached"], flush=True)

atexit.register(after_cudacore)
import cudacore as cc

d = cc.Device(0)
s = d.create_stream()
for n in (4096, 1 << 20):
    d.allocate(n, stream=s).close()
s.synchronize()
print("cached before exit", d.memory_stats()["cached"], flush=True)
if os.environ.get("FORK") == "1":
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the child's exit runs the handlers too: they must neither raise nor touch the driver
    _, status = os.waitpid(pid, 0)
    print("child exit status", status, flush=True)
"""


@pytest.mark.parametrize("setting", ["default", "off", "fork"])
def test_cached_memory_goes_back_to_the_driver_at_exit(setting: str) -> None:
    """A leak check at exit (compute-sanitizer --leak-check full) counted the blocks closed Buffers left in
    the allocator's cache; the cache is released when the interpreter exits."""
    env = {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}
    if setting == "off":
        env["CUDACORE_RELEASE_AT_EXIT"] = "0"
    if setting == "fork":
        env["FORK"] = "1"
    r = run_python(RELEASE_AT_EXIT, env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    if int(lines["cached before exit"]) == 0:
        pytest.skip("this allocator keeps no cache (the sync strategy)")
    if setting == "fork":
        assert lines["child exit status"] == "0", r.stderr
        assert "Traceback" not in r.stderr
    assert int(lines["cached at exit"]) == (int(lines["cached before exit"]) if setting == "off" else 0)


def test_staging_buffers_are_bounded_and_shown(dev: cc.Device) -> None:
    """Threads copying pageable memory at once, synchronously and on their own streams, share a pool of at
    most eight 4 MiB pinned staging buffers, which memory_stats()["pinned_staging"] shows (apart from
    pinned_in_use) and release_cached_memory() gives back; every byte arrives."""
    dev.release_cached_memory()
    assert dev.memory_stats()["pinned_staging"] == 0
    n = 20 << 20  # five chunks
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            s = dev.create_stream()
            with dev.allocate(n) as buf:
                for r in range(3):
                    src = np.full(n, (i * 3 + r) % 251, np.uint8)
                    out = np.empty(n, np.uint8)
                    stream = s if r % 2 else None
                    buf.copy_from(src, stream=stream)
                    buf.copy_to(out, stream=stream)
                    if not np.array_equal(src, out):
                        raise AssertionError(f"thread {i} round {r}: bytes differ")
            s.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "the copies waited for each other for good"
    assert not errors, errors
    stats = dev.memory_stats()
    assert 0 < stats["pinned_staging"] <= 8 * (4 << 20)
    assert stats["pinned_in_use"] == 0, "the staging buffers are not PinnedBuffers"
    dev.release_cached_memory()
    assert dev.memory_stats()["pinned_staging"] == 0


@pytest.fixture
def default_staging(dev: cc.Device):
    """The device's staging tuning, put back to the defaults afterwards."""
    from cudacore._copy import staging_tuning

    yield staging_tuning
    staging_tuning(dev.device_id, chunk=0)


def test_staging_tuning_hook(dev: cc.Device, default_staging) -> None:
    """The internal tuning hook (for scripts/gpu/pageable_probe.py) reads the documented defaults, applies a
    tuning that later copies then follow (chunks of its size, at most its number of buffers, every byte
    arriving both ways at sizes around its chunk and piece), refuses bad fields with InvalidValueError, and
    zero fields mean the defaults."""
    tune = default_staging
    defaults = {"chunk": 4 << 20, "buffers": 8, "workers": 8, "piece": 1 << 20, "burst": 16 << 20}
    assert tune(dev.device_id) == defaults
    # A burst of one chunk: each chunk's DMA drains before the next is enqueued, both ways.
    assert tune(dev.device_id, chunk=1 << 20, buffers=2, workers=3, piece=256 << 10, burst=1 << 20) == {
        "chunk": 1 << 20, "buffers": 2, "workers": 3, "piece": 256 << 10, "burst": 1 << 20}
    s = dev.create_stream()
    try:
        for n in (MiB + 1, 3 * MiB - 7, 5 * MiB + (256 << 10) + 1):
            src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
            out = np.empty(n, np.uint8)
            with dev.allocate(n) as buf:
                buf.copy_from(src, stream=s)
                buf.copy_to(out, stream=s)
                assert np.array_equal(src, out), n
                out[:] = 0
                buf.copy_from(src[::-1].copy())
                buf.copy_to(out)
                assert np.array_equal(src[::-1], out), n
            assert 0 < dev.memory_stats()["pinned_staging"] <= 2 * MiB
    finally:
        s.close()
    for bad in ({"chunk": 100}, {"buffers": -1}, {"workers": 10_000}, {"piece": 1}, {"burst": 5}, {"pieces": 4}, {"chunk": 1.5}, {"workers": True}):
        with pytest.raises(cc.InvalidValueError):
            tune(dev.device_id, **bad)
    assert tune(dev.device_id)["chunk"] == 1 << 20, "a refused tuning changes nothing"
    assert tune(dev.device_id, workers=1) == {**defaults, "workers": 1}, "zero fields: the defaults"


@pytest.mark.sim
@pytest.mark.parametrize("stream", [False, True], ids=["sync", "stream"])
@pytest.mark.parametrize("held", [0, 2], ids=["pool empty", "pool of two"])
def test_a_staged_copy_goes_on_when_pinned_memory_runs_out(dev: cc.Device, default_staging, stream: bool, held: int) -> None:
    """A staging buffer that cannot be allocated (pinned memory exhausted) fails no copy: with buffers in
    the pool the copy goes on with them, with none it is the driver's own copy, which needs no pinned
    memory of cudacore's. Every byte arrives both ways; release_cached_memory() lets the pool grow again."""
    from cudacore import testing

    tune = default_staging
    tune(dev.device_id, chunk=MiB, buffers=4)
    dev.release_cached_memory()
    n = 5 * MiB + 7
    s = dev.create_stream() if stream else None
    try:
        with dev.allocate(n) as buf:
            if held:
                buf.copy_from(np.zeros(held * MiB, np.uint8), nbytes=held * MiB)  # two chunks: two buffers
                assert dev.memory_stats()["pinned_staging"] == held * MiB
            src = np.random.default_rng(held).integers(0, 256, n, dtype=np.uint8)
            out = np.zeros(n, np.uint8)
            testing.inject_faults("cuMemHostAlloc:1:CUDA_ERROR_OUT_OF_MEMORY,cuMemHostAlloc:2:CUDA_ERROR_OUT_OF_MEMORY")
            buf.copy_from(src, stream=s)
            buf.copy_to(out, stream=s)
            # The empty pool tries to grow at each copy; the pool of two stops growing at its failure.
            assert testing.clear_faults() == (1 if held else 0)
            assert np.array_equal(src, out)
            assert dev.memory_stats()["pinned_staging"] == held * MiB, "the pool did not grow past the failure"
            dev.release_cached_memory()
            buf.copy_from(src, stream=s)
            if s is not None:
                s.synchronize()
            assert dev.memory_stats()["pinned_staging"] == 4 * MiB, "the pool grows again after a release"
    finally:
        if s is not None:
            s.close()


def test_staging_tuning_takes_an_int_device(dev: cc.Device, default_staging) -> None:
    """The hook's device is an ordinal: anything else (a float, a string, a bool, None, a Device) is a
    TypeError naming the hook, never converted to some ordinal; a device that does not exist is an
    InvalidValueError."""
    tune = default_staging
    for bad in (1.5, "0", True, None, dev):
        with pytest.raises(TypeError, match=r"staging_tuning: device must be an int"):
            tune(bad)
    with pytest.raises(cc.InvalidValueError, match="does not exist"):
        tune(cc.device_count())
    assert tune(dev.device_id)["chunk"] == 4 << 20


def test_numpy_refuses_a_buffer_with_a_message() -> None:
    # Without __array__, numpy.asarray(buf) made a one-element object array, silently.
    import numpy as np

    with cc.Device(0).allocate(64) as buf:
        for convert in (np.asarray, np.array):
            with pytest.raises(TypeError, match="device memory, which numpy cannot view: copy it to the host"):
                convert(buf)


@pytest.mark.parametrize("dtype", ["datetime64[ns]", "timedelta64[s]"])
def test_a_contiguous_datetime_array_is_not_called_non_contiguous(dev: cc.Device, dtype: str) -> None:
    """Issue 30 item 21: numpy cannot export datetime64/timedelta64 through the buffer protocol; the error
    says so and names the int64 view, instead of "must be C-contiguous"."""
    a = np.arange(8).astype(dtype)
    assert a.flags.c_contiguous
    with dev.allocate(64) as b:
        for call in (lambda: b.copy_from(a), lambda: b.copy_to(a), lambda: b.copy_from(a, stream=cc.Stream.legacy(dev))):
            with pytest.raises(TypeError, match=r"cannot export a .*64.* array through the buffer protocol.*view\('int64'\)") as ei:
                call()
            assert "C-contiguous" not in str(ei.value)
        b.copy_from(a.view("int64"))
        out = np.zeros(8, dtype=dtype)
        b.copy_to(out.view("int64"))
        assert (out == a).all()


# -- a Buffer closed on another thread while a call uses its memory --------------------------------------


def _copy_call(kind: str, buf: cc.Buffer, host: np.ndarray, s: cc.Stream) -> None:
    """One copy between ``buf`` and ``host`` by the path ``kind`` names; each releases the GIL for the copy."""
    if kind == "copy_from sync":  # the C hot path
        buf.copy_from(host)
    elif kind == "copy_from stream":  # the C hot path, staged on a stream
        buf.copy_from(host, stream=s)
    elif kind == "copy_from handle":  # the general path (a stream given by its handle)
        buf.copy_from(host, stream=s.handle)
    elif kind == "copy_to sync":
        buf.copy_to(host)
    else:  # the general path, device to host
        buf.copy_to(host, stream=s.handle)


@pytest.mark.parametrize("kind", ["copy_from sync", "copy_from stream", "copy_from handle", "copy_to sync", "copy_to handle"])
def test_a_buffer_closed_during_a_copy_on_another_thread_waits_for_it(dev: cc.Device, default_staging, kind: str) -> None:
    """A copy releases the GIL; a close() of its buffer on another thread meanwhile must wait until the copy
    is done, as a Stream's close waits for a copy on it. It freed the memory at once: the copy went on into
    memory the allocator then handed to the next Buffer (host to device: the new buffer's bytes were
    overwritten; device to host: the copy read the new buffer's bytes). Staged in small chunks, with a pause
    for the copy engine after each, so that the copy is long against the close."""
    default_staging(dev.device_id, chunk=64 << 10, buffers=2, workers=2, piece=16 << 10, burst=64 << 10)
    n = 3 * MiB + 13
    ones = np.ones(n, np.uint8)
    s = dev.create_stream()
    try:
        for trial in range(12):
            buf = dev.allocate(n)
            buf.copy_from(ones)
            host = ones.copy() if kind.startswith("copy_from") else np.empty(n, np.uint8)
            copying, results = threading.Event(), []

            def copier(buf=buf, host=host, copying=copying, results=results) -> None:
                copying.set()
                try:
                    for _ in range(4):
                        _copy_call(kind, buf, host, s)
                        s.synchronize()
                        if not kind.startswith("copy_from"):
                            results.append(int(np.count_nonzero(host != 1)))
                except cc.CUDAError as exc:
                    results.append(exc)

            t = threading.Thread(target=copier)
            t.start()
            copying.wait()
            buf.close()
            victim = dev.allocate(n)  # the freed block, as the allocator hands it out again
            victim.copy_from(np.zeros(n, np.uint8))
            t.join(60)
            assert not t.is_alive()
            got = np.empty(n, np.uint8)
            victim.copy_to(got)
            victim.close()
            assert not got.any(), f"trial {trial}: a copy into the closed buffer wrote into the next one"
            errors = [r for r in results if isinstance(r, Exception)]
            assert all(isinstance(e, cc.InvalidHandleError) and "closed" in str(e) for e in errors), errors
            assert [r for r in results if not isinstance(r, Exception)] == [0] * (len(results) - len(errors)), (
                f"trial {trial}: a copy from the closed buffer read another buffer's bytes")
    finally:
        s.close()


def test_a_close_inside_a_use_of_the_buffer_on_its_own_thread_is_refused(dev: cc.Device) -> None:
    """A close() that runs inside a call using the buffer on the same thread (a finalizer the collector runs
    during a copy, say) would wait for itself: it raises BufferError and frees nothing; once the call is
    over the buffer closes. A use of something that is not a Buffer counts nothing."""
    from cudacore._native import fast

    buf = dev.allocate(4096)
    with fast.using(buf, "not a buffer"):
        with pytest.raises(BufferError, match="a call on this thread uses its memory"):
            buf.close()
        assert not buf.closed
        buf.copy_from(bytes(4096))  # the memory is still the buffer's
    buf.close()
    assert buf.closed


FORK_DURING_A_USE = """
import os, sys, threading, warnings
import cudacore as cc
from cudacore._native import fast

warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, which this test means to do
d = cc.Device(0)
buf, dropped = d.allocate(4096), d.allocate(4096)
inside, done = threading.Event(), threading.Event()

def user():
    with fast.using(buf, dropped):  # a copy of the two under way at the fork, as far as they can tell
        inside.set()
        done.wait()

t = threading.Thread(target=user)
t.start()
inside.wait()
pid = os.fork()
if pid == 0:
    try:
        buf.close()
        print("child close returned", flush=True)
    except cc.CUDAError as exc:
        print("child close", exc.name, flush=True)
    del dropped  # deallocated: nothing to free here, and nothing to wait for
    print("child dealloc returned", flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit status", status, flush=True)
done.set()
t.join()
buf.close()
print("parent closed", buf.closed, flush=True)
"""


def test_a_forked_child_does_not_wait_for_uses_of_threads_left_in_the_parent() -> None:
    """A thread's use of a Buffer (a copy with the GIL released) under way at a fork stays counted in the
    child, where that thread does not exist: the child's close() and deallocation of the Buffer waited for
    it forever. In the child the close raises the fork error and the deallocation frees nothing, at once."""
    env = {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}
    r = run_python(FORK_DURING_A_USE, env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "child close CUDACORE_ERROR_FORKED",
        "child dealloc returned",
        "child exit status 0",
        "parent closed True",
    ], r.stderr


@pytest.mark.parametrize("stream", [True, False], ids=["on a stream", "synchronous"])
def test_a_buffer_closed_by_code_that_its_copy_runs_is_not_copied_into(dev: cc.Device, stream: bool) -> None:
    """The hot copy path asks the host object what it is (an attribute lookup, which a subclass's
    __getattr__ answers with Python code: code that can close the buffer, or let another thread run that
    does) before it names the buffer's address. A buffer closed there is the general path's, which raises
    the closed error; the small copy on a stream (made with the GIL held) went on into the freed block,
    which the allocator had handed to the next Buffer."""
    s = dev.create_stream()
    try:
        buf = dev.allocate(4096, stream=s)
        victims: list[cc.Buffer] = []

        class Closing(bytearray):
            def __getattr__(self, name: str) -> Any:
                if not victims:
                    buf.close()
                    victims.append(dev.allocate(4096, stream=s))  # the freed block, handed out again
                    victims[0].copy_from(bytes(4096), stream=s)
                raise AttributeError(name)

        with pytest.raises(cc.CUDAError, match="closed"):
            buf.copy_from(Closing(b"\x01" * 4096), stream=s if stream else None)
        s.synchronize()
        got = bytearray(4096)
        victims[0].copy_to(got)
        assert not any(got), "the copy wrote into the next Buffer"
    finally:
        for v in victims:
            v.close()
        s.close()


def test_a_close_waiting_for_another_threads_use_is_ended_by_ctrl_c(dev: cc.Device) -> None:
    """A close() that waits for another thread's copy of the buffer (a use) can be interrupted: Ctrl-C
    raises KeyboardInterrupt out of the wait, the buffer stays open while the other thread still uses it,
    and a later close frees it. (Before, the wait could not be interrupted: close returned only once the
    other thread was done, and the interrupt came after it.)"""
    import signal

    from cudacore._native import fast

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread")
    buf = dev.allocate(4096)
    holding, done = threading.Event(), threading.Event()

    def user() -> None:
        with fast.using(buf):  # as a copy on this thread holds the buffer while the GIL is released
            holding.set()
            done.wait(20)

    t = threading.Thread(target=user)
    t.start()
    timer = threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    try:
        assert holding.wait(10)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            buf.close()
        assert t.is_alive() and not done.is_set(), "the close waited until the other thread was done"
        assert not buf.closed
    finally:
        timer.cancel()
        done.set()
        t.join(30)
    buf.close()
    assert buf.closed

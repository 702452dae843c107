"""Races with a capture begun on another thread (tests/test_capture_outside.py has the rules themselves).

Calls that release the GIL check whether a capture runs and then call the driver; a capture begun on
another thread in between saw the call: a free of the allocator's cached blocks (cuMemFreeAsync), the
pool's synchronize (cuCtxSynchronize), cuMemAllocManaged and cuMemHostAlloc are unsafe calls, so the driver
refused them with 900 and invalidated a GLOBAL capture, and a cached block whose free the driver refused
was lost for good (taken out of the cache, never freed). Each check and the calls it allows must run while
no capture can begin (Registry.Steady), as AllocateTiles and allocate_shareable already do.

The doctor's probes (topology, verify) allocate and free outside every capture too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import cudacore as cc

BIG = 80 << 20  # above the cache's largest block: every allocation and free reaches the driver
BLOCKS = 20000  # cached blocks: freeing them all takes long enough for another thread to begin a capture


@pytest.fixture
def pool_dev(dev: cc.Device) -> cc.Device:
    if dev.allocation_strategy != "pool":
        pytest.skip("the allocator's cache needs the pool strategy")
    return dev


def invalidated(s: cc.Stream) -> bool:
    """Ends s's capture: whether the driver had invalidated it."""
    try:
        s.end_capture().destroy()
    except cc.CaptureError as e:
        assert "did not see" in str(e), e
        return True
    return False


def capture_while(d: cc.Device, call: Callable[[], Any], delay: float) -> tuple[bool, int]:
    """Fills the cache with BLOCKS blocks, runs call() on another thread and, delay seconds later, begins a
    GLOBAL capture here. Returns whether the capture was invalidated, and the device's free memory lost
    once everything is released."""
    d.release_cached_memory()
    free = d.memory_info()[0]
    bufs = [d.allocate(4096) for _ in range(BLOCKS)]
    for b in bufs:
        b.close()
    del bufs
    s = d.create_stream()
    t = threading.Thread(target=call)
    t.start()
    time.sleep(delay)
    s.begin_capture("global")
    t.join()
    bad = invalidated(s)
    s.close()
    d.release_cached_memory()
    return bad, free - d.memory_info()[0]


@pytest.mark.parametrize("delay", [0.0005, 0.002, 0.005])
def test_release_of_cached_memory_racing_a_capture_begun_on_another_thread(
    pool_dev: cc.Device, base: Any, delay: float
) -> None:
    bad, lost = capture_while(pool_dev, pool_dev.release_cached_memory, delay)
    assert not bad, "release_cached_memory freed cached blocks during the capture"
    assert lost == 0, f"{lost} bytes of cached blocks lost"


@pytest.mark.parametrize("delay", [0.0005, 0.002, 0.005])
def test_strategy_switch_racing_a_capture_begun_on_another_thread(
    pool_dev: cc.Device, base: Any, delay: float
) -> None:
    out: list[Any] = []

    def switch() -> None:
        try:
            pool_dev.set_allocation_strategy("pool")  # closes the old allocator: frees its cached blocks
        except cc.CUDAError as e:
            out.append(e)

    bad, lost = capture_while(pool_dev, switch, delay)
    assert not bad, f"the strategy switch freed cached blocks during the capture ({out})"
    assert lost == 0, f"{lost} bytes of cached blocks lost"


def test_doctor_probes_during_a_capture(dev: cc.Device, base: Any) -> None:
    """topology() and verify() (cudacore doctor) allocate and free to probe the device: during a GLOBAL
    capture they must be refused or wait, not invalidate it."""
    from cudacore._topology import topology
    from cudacore._verify import verify

    s = dev.create_stream()
    try:
        for probe in (topology, lambda: verify(0)):
            s.begin_capture("global")
            try:
                probe()
            except cc.CaptureError as e:
                assert e.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", e
            assert not invalidated(s), probe
    finally:
        s.close()


def race_captures(dev: cc.Device, call: Callable[[], Any], seconds: float = 8) -> int:
    """Runs call() in a loop on another thread while this one begins and ends GLOBAL captures; returns how
    many of the captures were invalidated (it stops at the first). A refusal of call() (900) is expected."""
    stop = threading.Event()
    unexpected: list[BaseException] = []

    def worker() -> None:
        while not stop.is_set():
            try:
                call()
            except cc.CaptureError as e:
                if e.name != "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED":
                    unexpected.append(e)
            except BaseException as e:  # noqa: BLE001 - reported below
                unexpected.append(e)
                return

    s = dev.create_stream()
    t = threading.Thread(target=worker)
    t.start()
    bad = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not bad:
            s.begin_capture("global")
            time.sleep(0)
            bad += invalidated(s)
            time.sleep(0)
    finally:
        stop.set()
        t.join()
        s.close()
    assert not unexpected, unexpected
    return bad


def test_managed_allocation_racing_captures_begun_on_another_thread(dev: cc.Device, base: Any) -> None:
    """cuMemAllocManaged is an unsafe call: the check that no capture forbids it, made with the GIL
    released, must hold until the driver has it. A stress test: the window is nanoseconds wide, and is hit
    within seconds on the simulator. (allocate_pinned has the same shape, and the same fix, but this loop
    did not hit its window.)"""
    if not dev.managed_memory:
        pytest.skip("no managed memory")
    assert race_captures(dev, lambda: dev.allocate_managed(4096).close()) == 0, (
        "a managed allocation reached the driver during a GLOBAL capture")


OOM_RETRY = """
import threading, cudacore as cc
d, d1 = cc.Device(0), cc.Device(1)
u = d.create_stream()
bufs = []
try:
    while True:
        bufs.append(d.allocate(32 << 20, stream=u))
except cc.OutOfMemoryError:
    pass
for b in bufs[:30]:  # about 1 GiB into the cache's free lists of u: the device is full
    b.close()
del bufs[:30]
s = d1.create_stream()
s.begin_capture("{mode}")
out = []
def work():
    try:
        d.allocate(512 << 20, stream=u).close()
        out.append("ok")
    except cc.CUDAError as e:
        out.append(type(e).__name__)
t = threading.Thread(target=work) if {other} else None
t.start() if t else work()
t.join() if t else None
s.end_capture().destroy()  # never invalidated
for b in bufs:
    b.close()
u.close(); s.close()
print(out[0])
"""


@pytest.mark.sim
@pytest.mark.parametrize(("mode", "other", "want"), [
    ("relaxed", False, "ok"),
    ("thread_local", True, "ok"),
    ("global", False, "CaptureError"),  # outside a GLOBAL capture the allocation itself is refused
])
def test_oom_retry_releases_the_cache_during_captures_that_allow_it(mode: str, other: bool, want: str) -> None:
    """An allocation outside every capture that runs out of memory releases the cache and retries. The
    change made the cache's release free nothing during any capture: where the capture allows the frees
    (RELAXED, another thread's THREAD_LOCAL; here on another device) the allocation failed with
    OutOfMemoryError while the cache held the memory it needed, and succeeded before the change."""
    from conftest import run_python

    r = run_python(OOM_RETRY.format(mode=mode, other=other), env={
        "CUDACORE_BACKEND": "sim",
        "CUDACORE_SIM_DEVICES": '[{"name": "a", "total_memory": 4294967296}, {"name": "b"}]',
    }, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split()[-1] == want, r.stdout


def test_pytorch_allocator_racing_captures_begun_on_another_thread(pool_dev: cc.Device, base: Any) -> None:
    """PyTorch calls cudacore's allocator without the GIL (here its generated doors, through ctypes, which
    drops the GIL too), so a capture may begin on another thread between the capture rules' check and the
    driver's allocation or free: both run while no capture can begin. (The doors are called rather than the
    entry points PyTorch loads, which throw a C++ exception for a refused allocation, as PyTorch expects.)"""
    import ctypes

    from cudacore import interop

    lib = ctypes.CDLL(interop.extension_path())
    libc = ctypes.CDLL(None)
    for name, params in (("cudacore_door_TorchMalloc", 3), ("cudacore_door_TorchFree", 1)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_void_p  # char *: the error's text, NULL on success
        fn.argtypes = [ctypes.c_int64] * params + [ctypes.POINTER(ctypes.c_int64)]
    u = pool_dev.create_stream()
    out = ctypes.c_int64(0)

    def call(fn: Any, *args: int) -> bool:
        err = fn(*args, ctypes.byref(out))
        if err:
            text = ctypes.string_at(err).decode()
            libc.free(ctypes.c_void_p(err))
            assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in text, text  # refused during a capture
            return False
        return True

    def alloc_free() -> None:
        if call(lib.cudacore_door_TorchMalloc, BIG, 0, u.handle):
            assert call(lib.cudacore_door_TorchFree, out.value)

    assert race_captures(pool_dev, alloc_free, seconds=4) == 0, "a PyTorch allocation or free reached the driver during a GLOBAL capture"
    assert interop.torch_live_allocations() == 0
    left = interop.last_error()  # process-wide: the last refusal, read (and so forgotten) here
    assert left is None or isinstance(left, cc.CaptureError), left
    u.close()


def test_device_synchronize_racing_captures_begun_on_another_thread(dev: cc.Device, base: Any) -> None:
    """Device.synchronize waits without the GIL: its capture check and the driver's cuCtxSynchronize (an
    unsafe call, which invalidates a GLOBAL capture) run while no capture can begin, so a capture begun on
    another thread meanwhile is never invalidated by it (it waits for the synchronize instead)."""
    stop, errors = threading.Event(), []

    def sync_loop() -> None:
        while not stop.is_set():
            try:
                dev.synchronize()
            except cc.CaptureError:
                pass  # refused: a capture runs
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    t = threading.Thread(target=sync_loop)
    t.start()
    s = dev.create_stream()
    bad = 0
    try:
        for _ in range(2000):
            time.sleep(0.0001)  # lets the other thread synchronize between the captures
            s.begin_capture("global")
            bad += invalidated(s)
    finally:
        stop.set()
        t.join()
        s.close()
    assert not errors, errors
    assert bad == 0, f"{bad} of 2000 captures were invalidated by a device synchronize"

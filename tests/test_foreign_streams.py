"""Streams cudacore did not create (docs/guide/memory.md, "Streams of other libraries"): their owner may destroy
them at any time after the call that named them, and no handle of such a stream reaches the driver
afterwards unless a watcher vouches for it.

On the simulator a "foreign" stream is made at the simulated driver behind cudacore's back
(``SimForeignStream``), and its owner destroys it there; a destroyed handle that reaches the simulator ends
the process, as the real driver crashes, so each case runs in a fresh interpreter. On a GPU the same
cases run with CuPy's own streams (the two crashes of CuPy's own suite).
"""

from __future__ import annotations

import pytest

from conftest import run_python

# A stand-in for CuPy's Stream on the simulator: the same module and class name, which is how cudacore
# knows a stream object whose handle lives exactly as long as the object, and the same life: the handle
# is made with the object and destroyed in __del__, before weak references are told.
FAKE_CUPY = """
import gc, sys, types
import cudacore as cc
from cudacore._api import core

class Stream:
    def __init__(self, non_blocking=False):
        self.ptr = core.SimForeignStream(0, non_blocking)
    def __del__(self):
        core.SimForeignStreamDestroy(0, self.ptr)
Stream.__module__ = "cupy.cuda.stream"
d = cc.Device(0)
def stats():
    s = d.memory_stats()
    return s["in_use"], s["orphaned"]
"""


def _ok(code: str, env: dict[str, str] | None = None) -> str:
    proc = run_python(code, env={"CUDACORE_BACKEND": "sim", **(env or {})})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.sim
def test_a_block_outliving_its_bare_handle_never_reaches_it() -> None:
    out = _ok(
        FAKE_CUPY
        + """
for i in range(20):
    h = core.SimForeignStream(0, i % 2 == 0)
    b = d.allocate(1 << 20, stream=h)      # the call names h: it is alive now
    core.SimForeignStreamDestroy(0, h)     # its owner destroys it
    b.close()                              # nobody vouches for h: an orphan, not a free on h
print(stats())
d.release_cached_memory()                  # a device synchronize, then the orphans go back
print(stats())
"""
    )
    assert out.split("\n")[:2] == [f"({20 << 20}, {20 << 20})", "(0, 0)"]


@pytest.mark.sim
def test_the_simulator_ends_the_process_on_a_destroyed_foreign_handle() -> None:
    # What the cases above guard against: the destroyed handle handed to the driver directly.
    proc = run_python(
        FAKE_CUPY + "h = core.SimForeignStream(0, True)\ncore.SimForeignStreamDestroy(0, h)\nd.allocate(64, stream=h)\n",
        env={"CUDACORE_BACKEND": "sim"},
    )
    assert proc.returncode != 0
    assert "which was destroyed" in proc.stderr


@pytest.mark.sim
def test_cupy_stream_destroyed_then_array_freed() -> None:
    # CuPy's own test_stream.py::TestStream::test_del_default, in the loop that crashed the process: a
    # new stream made current, an array allocated on it, the stream dropped, then the array freed. The
    # Buffer holds the stream object until it is freed, so the free finds the stream alive and is made in
    # its order; the stream goes after it.
    out = _ok(
        FAKE_CUPY
        + """
import weakref
for i in range(20):
    s = Stream()
    gone = weakref.ref(s)
    x = d.allocate(4096, stream=s)
    del s; gc.collect()
    assert gone() is not None, "the buffer keeps its stream"
    del x; gc.collect()
    assert gone() is None, "and lets it go once freed"
print(stats())
"""
    )
    assert out.split("\n")[0] == "(0, 0)"


@pytest.mark.sim
def test_a_free_on_another_thread_never_meets_a_destroyed_cupy_stream() -> None:
    # One thread makes streams, allocates on each and drops the stream; another frees the buffers. CuPy
    # destroys a stream before weak references hear of it, so without the buffer holding its stream a
    # free could reach the destroyed handle in between (the simulator ends the process there).
    out = _ok(
        FAKE_CUPY
        + """
import queue, threading
q = queue.Queue()
def producer():
    for _ in range(3000):
        s = Stream(); q.put(d.allocate(4096, stream=s)); del s
    q.put(None)
def consumer():
    while (x := q.get()) is not None:
        x.close()
ts = [threading.Thread(target=producer), threading.Thread(target=consumer)]
for t in ts: t.start()
for t in ts: t.join()
d.release_cached_memory()
print(stats())
""",
        env={},
    )
    assert out.split("\n")[0] == "(0, 0)"


@pytest.mark.sim
def test_a_block_of_a_destroyed_stream_is_not_handed_to_the_stream_that_reuses_its_handle() -> None:
    # The driver hands a destroyed stream's handle to the next stream made, a stream of cudacore's too. A
    # block of the old stream, freed after that, is an orphan: the new stream's order says nothing of the
    # old stream's work, which may still use the block.
    out = _ok(
        FAKE_CUPY
        + """
core.SimSetMemoryConditions(0, '{"reuse_handles": true}')
h = core.SimForeignStream(0, True)
x = d.allocate(4096, stream=h)
core.SimForeignStreamDestroy(0, h)
s = d.create_stream()
print(s.handle == h)
xp = x.ptr
x.close()
print(stats())
y = d.allocate(4096, stream=s)
print(y.ptr != xp)
y.close(); s.close()
d.release_cached_memory()
print(stats())
"""
    )
    assert out.split("\n")[:4] == ["True", "(4096, 4096)", "True", "(0, 0)"]


@pytest.mark.sim
def test_another_librarys_stream_may_take_the_handle_of_a_closed_cudacore_stream() -> None:
    out = _ok(
        FAKE_CUPY
        + """
core.SimSetMemoryConditions(0, '{"reuse_handles": true}')
s = d.create_stream(); old = s.handle; s.close()
c = Stream()
print(c.ptr == old)
x = d.allocate(4096, stream=c)   # a live CuPy stream with that handle: watched, so allocated on
x.close()
del c; gc.collect()
print(stats())
"""
    )
    assert out.split("\n")[:2] == ["True", "(0, 0)"]


@pytest.mark.sim
def test_orphans_go_back_in_batches_and_before_out_of_memory() -> None:
    # 1 GiB device: orphans past the batch bound are given back on their own, and an allocation that
    # does not fit gives back the rest first.
    out = _ok(
        FAKE_CUPY
        + """
import time
big = 96 << 20
for _ in range(3):
    h = core.SimForeignStream(0, False)
    b = d.allocate(big, stream=h)
    core.SimForeignStreamDestroy(0, h)
    b.close()
for _ in range(200):
    if stats()[1] == 0:
        break
    time.sleep(0.01)
print(stats())
h = core.SimForeignStream(0, False)
b = d.allocate(600 << 20, stream=h)
core.SimForeignStreamDestroy(0, h)
b.close()
print(stats())
c = d.allocate(900 << 20)
print(stats(), d.memory_stats()["ooms"])
c.close()
""",
        env={"CUDACORE_SIM_DEVICES": '[{"name": "sim-1g", "total_memory": 1073741824}]'},
    )
    lines = out.split("\n")
    assert lines[0] == "(0, 0)"
    # The 600 MiB orphan is over the batch bound: a flush of its own accord may have given it back
    # already; if not, the allocation that does not fit gives it back before it fails.
    assert lines[1] in (f"({600 << 20}, {600 << 20})", "(0, 0)")
    assert lines[2].startswith(f"({900 << 20}, 0) "), "the allocation fit, with no out-of-memory error raised"


@pytest.mark.sim
def test_a_strategy_change_gives_orphans_back_first() -> None:
    # Orphans were freed by their owners: they do not count as memory still allocated through the
    # allocator a strategy change replaces.
    out = _ok(
        FAKE_CUPY
        + """
h = core.SimForeignStream(0, True)
b = d.allocate(1 << 20, stream=h)
core.SimForeignStreamDestroy(0, h)
b.close()
print(stats())
d.set_allocation_strategy("sync")
print(stats(), d.allocation_strategy)
"""
    )
    assert out.split("\n")[:2] == [f"({1 << 20}, {1 << 20})", "(0, 0) sync"]


@pytest.mark.sim
def test_a_free_that_names_the_stream_is_ordered_on_it() -> None:
    # PyTorch's free and a cuda.core deallocation name the stream in the call: it is alive then.
    out = _ok(
        FAKE_CUPY
        + """
h = core.SimForeignStream(0, True)
b = d.allocate(4096, stream=h)
core.FreeNamed(0, b.ptr, 4096, h)
b._void()
print(stats())
core.SimForeignStreamDestroy(0, h)
"""
    )
    assert out.split("\n")[0] == "(0, 0)"


@pytest.mark.sim
def test_stream_objects_of_other_libraries_are_taken() -> None:
    out = _ok(
        FAKE_CUPY
        + """
class Proto:
    def __init__(self, h): self.h = h
    def __cuda_stream__(self): return (0, self.h)
class Bad:
    def __cuda_stream__(self): return "nope"
h = core.SimForeignStream(0, True)
b = d.allocate(64, stream=Proto(h))
print(b.stream_handle == h)
b.close()
try:
    d.allocate(64, stream=Bad())
except TypeError as e:
    print("TypeError", "__cuda_stream__" in str(e))
core.SimForeignStreamDestroy(0, h)
d.release_cached_memory()
print(stats())
"""
    )
    assert out.split("\n")[:3] == ["True", "TypeError True", "(0, 0)"]


# -- the same on a GPU, with CuPy's own streams ------------------------------------------------------------

CUPY_ON_CUDACORE = """
import gc
import cupy
import cudacore as cc
from cudacore import interop
cupy.cuda.set_allocator(interop.cupy_allocator())
d = cc.Device(0)
"""


@pytest.mark.gpu
def test_gpu_cupy_stream_destroyed_then_array_freed() -> None:
    pytest.importorskip("cupy")
    proc = run_python(
        CUPY_ON_CUDACORE
        + """
before = d.memory_stats()["in_use"]
for i in range(20):
    s = cupy.cuda.Stream(); s.use()
    x = cupy.array([1, 2, 3]) + i
    del s; gc.collect()
    cupy.cuda.Stream.null.use()
    del x; gc.collect()
d.release_cached_memory()
s = d.memory_stats()
print(s["in_use"] - before, s["orphaned"])
""",
        env={"CUDACORE_BACKEND": "cuda"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[0] == "0 0", proc.stdout + proc.stderr


@pytest.mark.gpu
def test_gpu_cupy_capture_on_its_stream_with_temporaries() -> None:
    # CuPy's own test_graph.py::TestGraph::test_capture_run_on_same_stream[True]: temporaries allocated
    # and freed inside a capture on a CuPy non-blocking stream, upload, launch, repeat; the stream goes
    # when the function returns, with the last graph's output still allocated.
    pytest.importorskip("cupy")
    proc = run_python(
        CUPY_ON_CUDACORE
        + """
def run(graph_first):
    s = cupy.cuda.Stream(non_blocking=True)
    a = cupy.random.random((100,))
    cupy.cuda.get_current_stream().synchronize()
    for f in (lambda a: ((a + 3) * 7.6) ** 2, lambda a: cupy.sqrt(3 * cupy.sin(a)),
              lambda a: cupy.fft.ifft(a * cupy.fft.fft(a))):
        with s:
            s.begin_capture()
            out1 = f(a)
            g = s.end_capture()
            g.upload()
            g.launch()
        s.synchronize()
        out2 = f(a)
        cupy.testing.assert_array_equal(out1, out2)
    # The graph and the stream go in either order, with the last output still allocated.
    if graph_first:
        del g; gc.collect(); del s; gc.collect()
    else:
        del s; gc.collect(); del g; gc.collect()
run(True)  # the first run leaves CuPy's caches (FFT plans, the random generator's state) allocated
gc.collect()
before = d.memory_stats()["in_use"]
for i in range(4):
    run(i % 2 == 0)
    gc.collect()
d.release_cached_memory()
s = d.memory_stats()
print(max(s["in_use"] - before, 0), s["orphaned"])  # nothing left behind (CuPy may free cache meanwhile)
""",
        env={"CUDACORE_BACKEND": "cuda"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[0] == "0 0", proc.stdout + proc.stderr


def test_a_cudacore_stream_speaks_the_stream_protocol() -> None:
    import cudacore as cc

    d = cc.Device(0)
    s = d.create_stream()
    assert s.__cuda_stream__() == (0, s.handle)
    assert cc.Stream.legacy(d).__cuda_stream__()[0] == 0
    b = d.allocate(4096, stream=s)  # named by its object: no protocol needed, and no foreign watch
    assert b.stream_handle == s.handle
    b.close()
    s.close()
    with pytest.raises(cc.InvalidHandleError, match="closed"):
        s.__cuda_stream__()


@pytest.mark.gpu
def test_gpu_cupy_takes_a_cudacore_stream() -> None:
    cupy = pytest.importorskip("cupy")
    import cudacore as cc

    s = cc.Device(0).create_stream()
    cs = cupy.cuda.Stream.from_external(s)  # through __cuda_stream__
    assert cs.ptr == s.handle
    with cs:
        x = cupy.arange(1000) * 2
    cs.synchronize()
    assert int(x[10]) == 20
    del x, cs
    s.close()


@pytest.mark.sim
def test_the_library_allocators_never_hand_a_closed_cudacore_stream_to_the_driver() -> None:
    # CuPy's current stream wrapping a cudacore Stream that was closed (cupy.cuda.ExternalStream of its
    # handle), and PyTorch's allocator handed the same handle: the first allocation on the device, which
    # checks whether the library's stream captures before it opens the devices to each other, must not
    # name the destroyed handle to the driver (the simulator ends the process there, as the real driver
    # crashes); the allocation refuses the stream, as cudacore's own allocation does.
    out = _ok(
        """
import ctypes, sys, types
import cudacore as cc
from cudacore import interop

class ExternalStream:
    def __init__(self, ptr):
        self.ptr = ptr
ExternalStream.__module__ = "cupy.cuda.stream"
current = []
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=None):
        self.ptr, self.size, self.owner = ptr, size, owner
cupy = types.ModuleType("cupy")
cupy.cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory),
    runtime=types.SimpleNamespace(getDevice=lambda: 0),
    get_current_stream=lambda: current[-1],
)
sys.modules["cupy"] = cupy
d = cc.Device(0)
s = d.create_stream(); h = s.handle; s.close()
current.append(ExternalStream(h))
try:
    interop.cupy_allocator()(4096)
except cc.InvalidHandleError as e:
    print("cupy", e.name)
lib = ctypes.CDLL(interop.extension_path())
lib.cudacore_door_TorchMalloc.restype = ctypes.c_void_p
lib.cudacore_door_TorchMalloc.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
ret = ctypes.c_int64(0)
err = lib.cudacore_door_TorchMalloc(4096, 0, h, ctypes.byref(ret))
print("torch", ctypes.string_at(err).decode().split()[1] if err else ret.value)
print(d.memory_stats()["in_use"])
""",
        env={"CUDACORE_SIM_DEVICES": '[{}, {}]'},
    )
    assert out.split("\n")[:3] == ["cupy CUDACORE_ERROR_CLOSED", "torch CUDACORE_ERROR_CLOSED", "0"], out

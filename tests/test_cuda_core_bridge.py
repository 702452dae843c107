"""The cuda.core bridge (issue 12, item 5): a cuda.core MemoryResource that allocates from cudacore.

cuda.core's Buffer asks the real driver about every pointer it wraps, so on the simulator the bridge runs
against a stand-in for cuda.core's two classes (what the bridge itself does: allocation, stream order,
bookkeeping, errors); on a GPU the same resource runs under the real cuda.core.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import cudacore as cc
from cudacore import interop


class _FakeCoreBuffer:
    """cuda.core.Buffer's part the bridge uses: from_handle keeps the resource, close deallocates."""

    def __init__(self, ptr: int, size: int, mr: Any) -> None:
        self.handle, self.size, self.memory_resource = ptr, size, mr

    @classmethod
    def from_handle(cls, ptr: int, size: int, mr: Any = None) -> _FakeCoreBuffer:
        return cls(ptr, size, mr)

    def close(self, stream: Any = None) -> None:
        self.memory_resource.deallocate(self.handle, self.size, stream=stream)


@pytest.fixture
def fake_cuda_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    core = types.ModuleType("cuda.core")
    core.Buffer = _FakeCoreBuffer  # type: ignore[attr-defined]
    core.MemoryResource = type("MemoryResource", (), {})  # type: ignore[attr-defined]
    pkg = types.ModuleType("cuda")
    pkg.core = core  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", pkg)
    monkeypatch.setitem(sys.modules, "cuda.core", core)
    monkeypatch.setattr(interop, "_cuda_core_class", None)
    yield


@pytest.mark.usefixtures("fake_cuda_core")
def test_allocations_come_from_cudacore_and_go_back() -> None:
    d = cc.Device(0)
    mr = interop.cuda_core_memory_resource(d)
    assert (mr.device_id, mr.is_device_accessible, mr.is_host_accessible) == (0, True, False)
    before = d.memory_stats()["in_use"]
    s = d.create_stream()
    a = mr.allocate(4096)
    b = mr.allocate(1 << 20, stream=s.handle)
    assert d.memory_stats()["in_use"] == before + 4096 + (1 << 20)
    assert "2 live" in repr(mr)
    a.close()
    other = d.create_stream()
    b.close(stream=types.SimpleNamespace(handle=other.handle))  # another stream: ordered by an event
    assert d.memory_stats()["in_use"] == before
    other.close()
    s.close()


@pytest.mark.usefixtures("fake_cuda_core")
def test_out_of_memory_and_bad_deallocations_are_typed() -> None:
    d = cc.Device(0)
    mr = interop.cuda_core_memory_resource(0)
    with pytest.raises(cc.OutOfMemoryError):
        mr.allocate(d.total_memory * 2)
    buf = mr.allocate(4096)
    with pytest.raises(cc.InvalidValueError, match="not allocated by this cudacore resource"):
        mr.deallocate(buf.handle + 1, 4096)
    with pytest.raises(cc.InvalidValueError):
        mr.deallocate(buf.handle, 8192)
    with pytest.raises(TypeError, match="cuda.core Stream"):
        mr.allocate(16, stream="s")
    buf.close()
    with pytest.raises(cc.InvalidValueError, match="deallocated already"):
        buf.close()


@pytest.mark.usefixtures("fake_cuda_core")
def test_a_memory_limit_applies_to_cuda_core() -> None:
    d = cc.Device(0)
    mr = interop.cuda_core_memory_resource(d)
    d.memory_limit = d.memory_stats()["in_use"] + (1 << 20)
    try:
        with pytest.raises(cc.OutOfMemoryError, match="limit"):
            mr.allocate(2 << 20)
    finally:
        d.memory_limit = None


@pytest.mark.gpu
def test_gpu_cuda_core_allocates_from_cudacore() -> None:
    core = pytest.importorskip("cuda.core")
    d = cc.Device(0)
    dev = core.Device(0)
    dev.set_current()
    s = dev.create_stream()
    mr = interop.cuda_core_memory_resource(d)
    before = d.memory_stats()["in_use"]
    buf = mr.allocate(1 << 20, stream=s)
    assert isinstance(buf, core.Buffer)
    assert buf.memory_resource is mr and buf.size == 1 << 20
    assert d.memory_stats()["in_use"] == before + (1 << 20)
    buf.fill(0x5A, stream=s)
    s.sync()
    out = bytearray(1 << 20)
    mr._live[int(buf.handle)].copy_to(out)
    assert out == b"\x5a" * (1 << 20)
    with pytest.raises(cc.OutOfMemoryError):
        mr.allocate(d.total_memory * 2, stream=s)
    buf.close(s)
    s.sync()
    assert d.memory_stats()["in_use"] == before
    s.close()


FOREIGN_STREAM = """
import cudacore as cc
from cuda import core
from cudacore import interop
dev = core.Device(0)
dev.set_current()
s = dev.create_stream()
mr = interop.cuda_core_memory_resource(0)
for _ in range(3):
    mr.allocate(4096, stream=s).close(s)
s.sync()
s.close()                            # cuda.core destroys its stream; cudacore is not told
print(cc.Device(0).release_cached_memory() >= 0)   # must not hand the dead stream to the driver
"""


@pytest.mark.gpu
def test_gpu_memory_freed_on_a_stream_cudacore_does_not_own_is_not_cached() -> None:
    """On the H100 this crashed the process: blocks freed on cuda.core's stream waited in the cache, and
    releasing them after cuda.core destroyed the stream handed the dead handle to the driver."""
    pytest.importorskip("cuda.core")
    from conftest import run_python

    proc = run_python(FOREIGN_STREAM, env={"CUDACORE_BACKEND": "cuda"}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("True")

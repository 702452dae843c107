"""Managed (unified) memory from Python (issue 12, item 4): allocate_managed, prefetch and advise.

On the simulator the calls check their arguments as the driver does and move nothing; on a GPU the same
tests run against the real driver (and the GPU test below uses the memory from a kernel).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import cudacore as cc

N = 1 << 20


@pytest.fixture
def dev() -> cc.Device:
    d = cc.Device(0)
    if not d.managed_memory:
        pytest.skip("the device has no managed memory")
    return d


def test_allocate_copy_prefetch_advise_close(dev: cc.Device) -> None:
    before = dev.memory_stats()
    data = np.arange(N // 4, dtype=np.uint32)
    with dev.allocate_managed(N) as m:
        assert isinstance(m, cc.ManagedBuffer) and isinstance(m, cc.Buffer)
        assert m.size == N and m.device is dev
        stats = dev.memory_stats()
        assert stats["managed_in_use"] == before["managed_in_use"] + N
        assert stats["managed_allocations"] == before["managed_allocations"] + 1
        assert stats["in_use"] == before["in_use"], "managed memory is not the allocator's"
        m.copy_from(data)
        s = dev.create_stream()
        m.advise("read_mostly", dev)
        m.advise("preferred_location", "cpu")
        m.advise("accessed_by", 0)
        m.advise("unset_read_mostly", dev)
        m.prefetch(dev, stream=s)
        m.prefetch("cpu", stream=s)
        s.synchronize()
        out = np.zeros_like(data)
        m.copy_to(out)
        assert (out == data).all()
        assert m.__cuda_array_interface__["data"][0] == m.ptr
        s.close()
    assert m.closed
    assert dev.memory_stats()["managed_in_use"] == before["managed_in_use"]
    m.close()  # idempotent


def test_a_collected_managed_buffer_is_freed(dev: cc.Device) -> None:
    before = dev.memory_stats()["managed_in_use"]
    dev.allocate_managed(4096)
    assert dev.memory_stats()["managed_in_use"] == before


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda m: m.advise("bogus", 0), cc.InvalidValueError, "unknown advice 'bogus'"),
        (lambda m: m.advise(3, 0), cc.InvalidValueError, "unknown advice 3"),
        (lambda m: m.prefetch("gpu"), cc.InvalidValueError, "prefetch must be a Device"),
        (lambda m: m.prefetch(1.5), TypeError, "prefetch must be a Device"),
        (lambda m: m.prefetch(-2), cc.CUDAError, "device ordinal >= 0"),
        (lambda m: m.prefetch(64), cc.CUDAError, "cannot prefetch to device 64"),
        (lambda m: m.advise("accessed_by", 99), cc.CUDAError, "cannot advise for device 99"),
        (lambda m: m.prefetch(0, stream=2**64), cc.InvalidValueError, "stream"),
    ],
)
def test_bad_arguments_are_clear_errors(dev: cc.Device, call, exc, match) -> None:
    with dev.allocate_managed(4096) as m, pytest.raises(exc, match=match):
        call(m)


def test_bad_sizes_and_closed_buffers(dev: cc.Device) -> None:
    for n in (0, -1):
        with pytest.raises(cc.InvalidValueError, match="nbytes"):
            dev.allocate_managed(n)
    with pytest.raises(TypeError):
        dev.allocate_managed("4096")  # type: ignore[arg-type]
    m = dev.allocate_managed(4096)
    m.close()
    with pytest.raises(cc.CUDAError, match="closed"):
        m.prefetch(dev)


def test_prefetch_on_a_closed_stream_is_refused(dev: cc.Device) -> None:
    s = dev.create_stream()
    s.close()
    with dev.allocate_managed(4096) as m, pytest.raises(cc.CUDAError):
        m.prefetch(dev, stream=s)


def test_managed_allocation_is_refused_during_a_global_capture(dev: cc.Device) -> None:
    s = dev.create_stream()
    with pytest.raises(cc.CaptureError, match="managed allocation"), s.capture(mode="global"):
        dev.allocate_managed(4096)
    s.close()


def test_a_managed_buffer_closed_during_a_capture_is_freed_after_it(dev: cc.Device) -> None:
    s = dev.create_stream()
    before = dev.memory_stats()["managed_in_use"]
    m = dev.allocate_managed(4096)
    with s.capture():
        m.close()
        assert dev.memory_stats()["managed_in_use"] == before + 4096, "cuMemFree would end the capture"
    assert dev.memory_stats()["managed_in_use"] == before
    s.close()


def test_managed_buffers_do_not_pickle(dev: cc.Device) -> None:
    with dev.allocate_managed(4096) as m, pytest.raises(TypeError):
        pickle.dumps(m)


def test_the_out_of_memory_advice_names_allocate_managed() -> None:
    d = cc.Device(0)
    with pytest.raises(cc.OutOfMemoryError, match=r"allocate_managed"):
        d.allocate(d.total_memory * 2)


@pytest.mark.gpu
def test_gpu_a_kernel_writes_managed_memory_the_host_reads() -> None:
    from pathlib import Path

    d = cc.Device(0)
    n = 1 << 16
    with d.load_module(Path(__file__).parent / "kernels" / "fill.ptx") as mod, d.allocate_managed(4 * n) as m:
        s = d.create_stream()
        m.prefetch(d, stream=s)
        mod.function("fill").launch(grid=n // 256, block=256, args=(m, np.uint32(77), np.uint64(n)), stream=s)
        m.prefetch("cpu", stream=s)
        s.synchronize()
        out = np.zeros(n, np.uint32)
        m.copy_to(out)
        assert (out == 77).all()
        s.close()


def test_bad_sizes_name_allocate_managed_not_allocate_tiles(dev: cc.Device) -> None:
    """Issue 30 item 21: the refusal of a bad size names the call that was made."""
    for n in (0, -1):
        with pytest.raises(cc.InvalidValueError) as ei:
            dev.allocate_managed(n)
        assert ei.value.op == "cudacore.allocate_managed"
        assert "allocate_tiles" not in str(ei.value)
        assert str(ei.value).startswith(f"cudacore.allocate_managed: nbytes must be positive, got {n}")
    with pytest.raises(TypeError, match=r"^cudacore.allocate_managed: nbytes must be an int, not str"):
        dev.allocate_managed("4096")  # type: ignore[arg-type]

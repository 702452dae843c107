"""Interop on a real GPU: CuPy, PyTorch and Numba take cudacore buffers and cudacore takes their arrays
(zero copy), and each framework runs a workload on cudacore's allocator, including its out of memory.

Run on the GPU machine with ``CUDACORE_BACKEND=cuda``; ``-s`` shows the memory statistics each workload
prints (the lines starting ``cudacore-stats``). The allocator workloads that must own the framework's
allocator from the start (PyTorch, Numba) run in a fresh interpreter.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from conftest import run_python

pytestmark = pytest.mark.gpu


def _stats_line(label: str, stats: dict) -> str:
    keys = ("in_use", "peak_in_use", "cached", "allocations", "frees", "ooms", "strategy")
    return f"cudacore-stats {label}: " + json.dumps({k: stats[k] for k in keys})


# -- zero copy, both ways ----------------------------------------------------------------------------------


def test_cupy_takes_buffers_by_dlpack_and_cai() -> None:
    cp = pytest.importorskip("cupy")
    import cudacore as cc

    dev = cc.Device(0)
    buf = dev.allocate(4096)
    host = np.arange(1024, dtype=np.float32)
    buf.copy_from(host)
    a = cp.from_dlpack(buf)  # DLPack
    assert a.dtype == cp.uint8 and a.size == 4096 and a.data.ptr == buf.ptr
    f = a.view(cp.float32)
    assert float(f[10]) == 10.0
    f *= 2  # written through CuPy, read through cudacore
    cp.cuda.get_current_stream().synchronize()
    out = np.empty_like(host)
    buf.copy_to(out)
    assert out[10] == 20.0
    with pytest.raises(BufferError):
        buf.close()  # CuPy still uses it
    del a, f
    gc.collect()
    b = cp.asarray(buf)  # __cuda_array_interface__
    assert b.data.ptr == buf.ptr and b.nbytes == 4096
    del b
    buf.close()


def test_torch_takes_buffers_by_dlpack() -> None:
    torch = pytest.importorskip("torch")
    import cudacore as cc

    buf = cc.Device(0).allocate(4096)
    buf.copy_from(np.arange(1024, dtype=np.float32))
    t = torch.from_dlpack(buf)
    assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == 4096 and t.data_ptr() == buf.ptr
    f = t.view(torch.float32)
    assert f[10].item() == 10.0
    f.add_(1)
    torch.cuda.synchronize()
    out = np.empty(1024, dtype=np.float32)
    buf.copy_to(out)
    assert out[10] == 11.0
    del t, f
    gc.collect()
    buf.close()


def test_cudacore_takes_cupy_and_torch_arrays() -> None:
    import cudacore as cc

    cp = pytest.importorskip("cupy")
    a = cp.arange(1000, dtype=cp.float64)
    view = cc.asbuffer(a)
    assert isinstance(view, cc.ExternalBuffer) and view.ptr == a.data.ptr and view.size == 8000
    out = np.empty(1000, dtype=np.float64)
    cp.cuda.get_current_stream().synchronize()
    view.copy_to(out)
    assert out[999] == 999.0
    dl = cc.interop.from_dlpack(a)
    assert dl.ptr == a.data.ptr and dl.size == 8000
    dl.close()
    with pytest.raises(ValueError, match="C-contiguous"):
        cc.asbuffer(a.reshape(100, 10)[:, ::2])

    torch = pytest.importorskip("torch")
    t = torch.arange(1000, dtype=torch.float32, device="cuda")
    tv = cc.Device(0).from_array(t)
    assert tv.ptr == t.data_ptr() and tv.size == 4000
    torch.cuda.synchronize()
    out32 = np.empty(1000, dtype=np.float32)
    tv.copy_to(out32)
    assert out32[123] == 123.0
    dt = cc.interop.from_dlpack(t)
    assert dt.ptr == t.data_ptr()
    dt.close()


# -- CuPy on cudacore's allocator -------------------------------------------------------------------------


def test_cupy_workload_on_cudacore_allocator() -> None:
    cp = pytest.importorskip("cupy")
    import cudacore as cc

    dev = cc.Device(0)
    previous = cp.cuda.get_allocator()
    cp.cuda.set_allocator(cc.interop.cupy_allocator(dev))
    try:
        before = dev.memory_stats()
        a = cp.random.rand(2048, 2048, dtype=cp.float32)
        b = cp.random.rand(2048, 2048, dtype=cp.float32)
        c = a @ b
        d = cp.sin(c) * 2 + a
        total = float(d.sum())
        assert np.isfinite(total)
        ref = (cp.asnumpy(a[:4]) @ cp.asnumpy(b))[:, :4]
        assert np.allclose(cp.asnumpy(c[:4, :4]), ref, rtol=1e-3)
        during = dev.memory_stats()
        assert during["in_use"] >= before["in_use"] + 4 * 2048 * 2048 * 4
        assert during["allocations"] > before["allocations"]
        del a, b, c, d
        gc.collect()
        cp.cuda.get_current_stream().synchronize()
        after = dev.memory_stats()
        assert after["in_use"] == before["in_use"]
        with pytest.raises(MemoryError) as info:
            cp.empty(1 << 46, dtype=cp.uint8)  # 64 TiB
        assert isinstance(info.value, cc.OutOfMemoryError)
        # a stream other than the null stream
        with cp.cuda.Stream(non_blocking=True):
            e = cp.ones(1 << 20, dtype=cp.float32)
            assert float(e.sum()) == float(1 << 20)
            del e
        print(_stats_line("cupy", dev.memory_stats()))
    finally:
        cp.cuda.set_allocator(previous)


# -- PyTorch on cudacore's allocator (a fresh interpreter: the allocator is chosen before CUDA starts) -------

TORCH_WORKLOAD = r"""
import gc, json
import torch
import cudacore as cc
from cudacore import interop

alloc = interop.use_torch_allocator()
dev = cc.Device(0)
before = dev.memory_stats()
a = torch.randn(2048, 2048, device="cuda")
b = torch.randn(2048, 2048, device="cuda")
c = a @ b
d = torch.relu(c) + a * 2
s = float(d.sum())
torch.cuda.synchronize()
ref = (a[:4].cpu() @ b.cpu())[:, :4]
ok_matmul = bool(torch.allclose(c[:4, :4].cpu(), ref, rtol=1e-3, atol=1e-3))
during = dev.memory_stats()
live_during = interop.torch_live_allocations()
del a, b, c, d
gc.collect()
torch.cuda.synchronize()
after = dev.memory_stats()
oom_type = None
try:
    torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
    oom_message = ""
except Exception as exc:
    oom_type, oom_message = type(exc).__name__, str(exc)
err = interop.last_error()
print("RESULT " + json.dumps({
    "ok_matmul": ok_matmul, "sum_finite": s == s,
    "in_use_before": before["in_use"], "in_use_during": during["in_use"], "in_use_after": after["in_use"],
    "allocations_during": during["allocations"] - before["allocations"], "live_during": live_during,
    "live_after": interop.torch_live_allocations(),
    "oom_type": oom_type, "oom_message": oom_message, "last_error": type(err).__name__ if err else None,
    "stats": dev.memory_stats(),
}))
"""


def test_torch_workload_on_cudacore_allocator() -> None:
    pytest.importorskip("torch")
    proc = run_python(TORCH_WORKLOAD, env={"CUDACORE_BACKEND": "cuda"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])
    print(_stats_line("torch", r["stats"]))
    print("torch result:", {k: v for k, v in r.items() if k != "stats"})
    assert r["ok_matmul"] and r["sum_finite"]
    assert r["in_use_during"] >= r["in_use_before"] + 4 * 2048 * 2048 * 4
    assert r["allocations_during"] >= 4 and r["live_during"] >= 4
    # torch keeps one allocation for the process: cuBLAS's workspace (32 MiB on the H100, seen live_after 1).
    assert r["live_after"] <= 1 and r["in_use_after"] <= r["in_use_before"] + (64 << 20)
    assert r["oom_type"] == "RuntimeError", "torch must raise for a 64 TiB tensor on cudacore's allocator"
    assert r["oom_message"].startswith("cudacore: ")
    assert "out of memory allocating 64.0 TiB" in r["oom_message"]
    assert r["last_error"] == "OutOfMemoryError"


# -- Numba on cudacore's allocator (EMM plugin by environment variable) -----------------------------------------

NUMBA_WORKLOAD = r"""
import gc, json
import numpy as np
from numba import cuda
import cudacore as cc

@cuda.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]

n = 1 << 20
dev = cc.Device(0)
mgr = type(cuda.current_context().memory_manager).__name__
before = dev.memory_stats()
x = cuda.to_device(np.arange(n, dtype=np.float32))
y = cuda.to_device(np.ones(n, dtype=np.float32))
out = cuda.device_array(n, dtype=np.float32)
axpy[(n + 255) // 256, 256](out, 2.0, x, y)
host = out.copy_to_host()
during = dev.memory_stats()
del x, y, out
gc.collect()
cuda.synchronize()
after = dev.memory_stats()
oom_type = None
try:
    cuda.device_array(1 << 46, dtype=np.uint8)
except Exception as exc:
    oom_type = type(exc).__name__
print("RESULT " + json.dumps({
    "manager": mgr, "ok": bool(host[10] == 21.0 and host[-1] == 2.0 * (n - 1) + 1),
    "in_use_before": before["in_use"], "in_use_during": during["in_use"], "in_use_after": after["in_use"],
    "oom_type": oom_type, "stats": dev.memory_stats(),
}))
"""


NUMBA_ALONE = r"""
import numpy as np
from numba import cuda

@cuda.jit
def inc(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1

a = cuda.to_device(np.zeros(8, np.float32))
inc[1, 8](a)
print(a.copy_to_host().sum())
"""


def test_numba_workload_on_cudacore_allocator() -> None:
    pytest.importorskip("numba.cuda")
    # Numba itself must be able to run a kernel here first (on the GPU machine its version did not work
    # with the installed numpy: "module 'numpy' has no attribute 'row_stack'"), else this tests Numba.
    alone = run_python(NUMBA_ALONE, env={"CUDACORE_BACKEND": "cuda"}, timeout=300)
    if alone.returncode != 0:
        pytest.skip("Numba cannot run a kernel on this machine without cudacore: " + alone.stderr.strip().splitlines()[-1])
    proc = run_python(
        NUMBA_WORKLOAD, env={"CUDACORE_BACKEND": "cuda", "NUMBA_CUDA_MEMORY_MANAGER": "cudacore.interop"}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])
    print(_stats_line("numba", r["stats"]))
    print("numba result:", {k: v for k, v in r.items() if k != "stats"})
    assert r["manager"] == "NumbaMemoryManager"
    assert r["ok"]
    assert r["in_use_during"] >= r["in_use_before"] + 3 * 4 * (1 << 20)
    assert r["in_use_after"] == r["in_use_before"]
    assert r["oom_type"] == "OutOfMemoryError"


CUDNN_BENCHMARK = """
import json, warnings
import torch
import cudacore as cc
torch.backends.cudnn.benchmark = True
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    cc.interop.use_torch_allocator()
warned = [str(w.message) for w in rec if "cudnn.benchmark" in str(w.message)]
conv = torch.nn.Conv2d(8, 8, 3).cuda()
x = torch.randn(4, 8, 32, 32, device="cuda")
try:
    conv(x); torch.cuda.synchronize(); bench_error = None
except RuntimeError as exc:
    bench_error = str(exc)
torch.backends.cudnn.benchmark = False
y = conv(x); torch.cuda.synchronize()
print("RESULT " + json.dumps({"warned": warned, "bench_error": bench_error, "plain_ok": bool(torch.isfinite(y).all())}))
"""


def test_torch_cudnn_benchmark_limit_is_warned_and_documented() -> None:
    """Issue 12, item 6: PyTorch's pluggable allocators have no cacheInfo; benchmark mode off works."""
    pytest.importorskip("torch")
    proc = run_python(CUDNN_BENCHMARK, env={"CUDACORE_BACKEND": "cuda"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    print("cudnn benchmark on cudacore's allocator:", r)
    assert r["warned"], "use_torch_allocator() warns when benchmark mode is on"
    assert r["plain_ok"], "with benchmark mode off, cuDNN convolutions run on cudacore's allocator"
    if r["bench_error"] is not None:  # a PyTorch that answers cacheInfo for pluggable allocators would pass
        assert "cacheInfo" in r["bench_error"]

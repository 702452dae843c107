"""One pool for every library of the process (cudacore.share_pool) on a real GPU, with the real libraries.

Each workload runs in a fresh interpreter: PyTorch chooses its allocator backend when it is imported, and
the device's current pool is state of the whole process. Run on the GPU machine with
``CUDACORE_BACKEND=cuda``; ``-s`` shows what each workload measured (the lines starting ``one-pool``).
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_python

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _result(proc: object) -> dict:
    out = proc.stdout  # type: ignore[attr-defined]
    assert proc.returncode == 0, out + proc.stderr  # type: ignore[attr-defined]
    r = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    print("one-pool:", json.dumps(r))
    return r


def _run(code: str) -> dict:
    return _result(run_python(code, env={"CUDACORE_BACKEND": "cuda"}, timeout=300))


# The CUDA runtime (which PyTorch, CuPy and RMM call) and the driver share the device's current pool: the
# runtime's cudaDeviceGetMemPool sees the pool cudacore made current with cuDeviceSetMemPool.
RUNTIME_SEES_CURRENT = r"""
import json
import math
import cudacore as cc
import cupy
sp = cc.share_pool(0, libraries=[])
seen = int(cupy.cuda.runtime.deviceGetMemPool(0))
sp.undo()
after = int(cupy.cuda.runtime.deviceGetMemPool(0))
default = int(cupy.cuda.runtime.deviceGetDefaultMemPool(0))
print("RESULT " + json.dumps({"handle": sp.handle, "seen": seen, "previous": sp.previous_pool, "after": after, "default": default}))
"""


def test_the_runtime_sees_the_current_pool() -> None:
    pytest.importorskip("cupy")
    r = _run(RUNTIME_SEES_CURRENT)
    assert r["seen"] == r["handle"], "cudaDeviceGetMemPool answers the pool cuDeviceSetMemPool made current"
    assert r["after"] == r["previous"] == r["default"]


# -- PyTorch -----------------------------------------------------------------------------------------------

TORCH_SHARED = r"""
import json
import math
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, libraries=["torch"])
import torch
backend = torch.cuda.get_allocator_backend()
base = dev.memory_stats()["pool_used"]
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
with_x = dev.memory_stats()
# Training steps with cuDNN's autotuner, which fails on a pluggable allocator (no cacheInfo).
torch.backends.cudnn.benchmark = True
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3), torch.nn.Flatten(),
                            torch.nn.Linear(16 * 28 * 28, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
for _ in range(5):
    inp = torch.randn(32, 3, 32, 32, device="cuda")
    target = torch.randint(0, 10, (32,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(inp), target)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(float(loss))
torch.cuda.synchronize()
during = dev.memory_stats()
del x
torch.cuda.synchronize()
print("RESULT " + json.dumps({
    "wired": sp.libraries["torch"].wired, "how": sp.libraries["torch"].how, "backend": backend,
    "base": base, "with_x": with_x["pool_used"], "by_library": with_x["by_library"],
    "during": during["pool_used"], "losses": losses,
}))
"""


def test_torch_allocates_from_the_shared_pool_and_cudnn_benchmark_trains() -> None:
    pytest.importorskip("torch")
    r = _run(TORCH_SHARED)
    assert r["wired"] and "imported after this" in r["how"]
    assert r["backend"] == "cudaMallocAsync"
    assert r["with_x"] >= r["base"] + 64 * MiB, "PyTorch's tensor is in the shared pool"
    by = r["by_library"]
    assert by["torch (by difference)"] >= 64 * MiB and by["unattributed"] == 0, (
        "PyTorch publishes no count: the one library without one takes the pool's remainder, by difference")
    assert len(r["losses"]) == 5 and all(math.isfinite(v) for v in r["losses"]), "training steps with cudnn.benchmark run"


# cuDNN's autotuner under the shared pool: benchmark mode asks the allocator for its largest free block
# (cacheInfo), which the cudaMallocAsync backend answers; the convolution's result matches the CPU's.
TORCH_CONV_BENCHMARK = r"""
import json
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, libraries=["torch"])
import torch
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
x = torch.randn(16, 64, 56, 56, device="cuda", requires_grad=True)
errors = []
for _ in range(3):  # the first call benchmarks the algorithms, the others reuse the one chosen
    y = conv(x)
    y.sum().backward()
    ref = torch.nn.functional.conv2d(x.detach().cpu(), conv.weight.detach().cpu(), conv.bias.detach().cpu(), padding=1)
    errors.append(float((y.detach().cpu() - ref).abs().max()))
torch.cuda.synchronize()
stats = dev.memory_stats()
print("RESULT " + json.dumps({
    "backend": torch.cuda.get_allocator_backend(), "cudnn": torch.backends.cudnn.is_available(),
    "errors": errors, "grad": float(x.grad.abs().sum()), "used": stats["pool_used"], "by_library": stats["by_library"],
}))
"""


def test_torch_conv_with_cudnn_benchmark_runs_on_the_shared_pool() -> None:
    pytest.importorskip("torch")
    r = _run(TORCH_CONV_BENCHMARK)
    assert r["backend"] == "cudaMallocAsync" and r["cudnn"]
    assert len(r["errors"]) == 3 and all(e < 1e-3 for e in r["errors"]), r["errors"]
    assert math.isfinite(r["grad"]) and r["grad"] > 0
    assert r["by_library"]["torch (by difference)"] >= 16 * 128 * 56 * 56 * 4, "the output and its gradient are in the pool"


# PyTorch's out-of-memory error under the shared pool, explained: its backend refuses the out-of-memory
# observer, so the user's call is the route; the verdict is the pool's maximum size, with the split.
TORCH_OOM = r"""
import json
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, max_size=1 << 30, libraries=["torch"])
import torch
try:
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: None)
    observer = None
except RuntimeError as e:
    observer = str(e)
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
used = dev.memory_stats()["pool_used"]
try:
    torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    out = {"raised": None}
except torch.OutOfMemoryError as e:
    err = cc.explain_oom(e)
    try:
        raise cc.explain_oom(e) from e
    except cc.OutOfMemoryError as again:
        chained = again.__cause__ is e and again.cause == err.cause
    out = {"raised": str(e), "cause": err.cause, "op": err.op, "requested": err.requested, "device": err.device,
           "by_library": err.by_library, "message": str(err), "pool_others": err.pool_others, "chained": chained}
out.update(observer=observer, used=used)
print("RESULT " + json.dumps(out))
"""


def test_torch_out_of_memory_in_the_shared_pool_gets_the_verdict_and_the_split() -> None:
    pytest.importorskip("torch")
    r = _run(TORCH_OOM)
    assert r["observer"] is not None and "does not yet support attachOutOfMemoryObserver" in r["observer"], (
        "PyTorch's cudaMallocAsync backend refuses the out-of-memory observer (docs/guide/one-pool.md)")
    assert r["raised"] is not None, "PyTorch cannot allocate more than the pool's maximum size"
    assert (r["cause"], r["op"], r["requested"], r["device"]) == ("pool_max_size", "torch", 2 << 30, 0)
    assert r["chained"]
    by = r["by_library"]
    assert by["torch"] == 256 * MiB, "PyTorch's own count, from its message"
    assert r["pool_others"] >= 256 * MiB
    assert by["unattributed"] <= 0.05 * r["used"], "at least 95% of the pool's use attributed to named libraries"
    assert r["message"].startswith("the pool reached its maximum size:")
    assert "By library, the shared pool's" in r["message"] and "torch 256.0 MiB" in r["message"]


TORCH_TOO_LATE = r"""
import json
import math
import torch
import cudacore as cc
sp = cc.share_pool(0, libraries=["torch"])
w = sp.libraries["torch"]
print("RESULT " + json.dumps({"wired": w.wired, "how": w.how, "backend": torch.cuda.get_allocator_backend()}))
sp.undo()
"""


def test_torch_imported_first_is_reported_too_late() -> None:
    pytest.importorskip("torch")
    r = _run(TORCH_TOO_LATE)
    assert r["backend"] == "native"
    assert not r["wired"] and "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" in r["how"]


# -- CuPy ----------------------------------------------------------------------------------------------------

CUPY_SHARED = r"""
import json, warnings
import cupy
import cudacore as cc
dev = cc.Device(0)
before_alloc = cupy.cuda.memory.get_allocator()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sp = cc.share_pool(0, release_threshold=1 << 30, libraries=["cupy"])
warned = any("CuPy reads the shared pool's release threshold" in str(w.message) for w in caught)
RT = cupy.cuda.runtime
threshold = int(RT.memPoolGetAttribute(sp.handle, RT.cudaMemPoolAttrReleaseThreshold))
base = dev.memory_stats()["pool_used"]
a = cupy.zeros(32 << 20, dtype=cupy.uint8)
b = int((a + 1).sum())
cupy.cuda.get_current_stream().synchronize()
with_a = dev.memory_stats()["pool_used"]
try:
    cupy.zeros(2 << 30, dtype=cupy.uint8)  # the pool would grow beyond the threshold, CuPy's limit
    beyond = None
except cupy.cuda.memory.OutOfMemoryError as e:
    beyond = str(e)
del a
cupy.cuda.get_current_stream().synchronize()
sp.undo()
restored = cupy.cuda.memory.get_allocator() is before_alloc
c = cupy.ones(1024)
print("RESULT " + json.dumps({
    "wired": sp.libraries["cupy"].wired, "warned": warned, "threshold": threshold, "base": base,
    "with_a": with_a, "sum": b, "beyond": beyond, "restored": restored, "after_undo_ok": float(c.sum()) == 1024.0,
}))
"""


def test_cupy_allocates_from_the_shared_pool_and_is_put_back() -> None:
    pytest.importorskip("cupy")
    r = _run(CUPY_SHARED)
    assert r["wired"] and r["warned"]
    assert r["threshold"] == 1 << 30, "the threshold asked is set again after CuPy's MemoryAsyncPool set its own"
    assert r["with_a"] >= r["base"] + 32 * MiB, "CuPy's array is in the shared pool"
    assert r["sum"] == 32 << 20
    assert r["beyond"] is not None, "CuPy refuses to grow the pool beyond its release threshold"
    assert r["restored"] and r["after_undo_ok"]


CUPY_OOM = r"""
import json
import cupy
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, max_size=1 << 30, libraries=["cupy"])
a = cupy.zeros(256 << 20, dtype=cupy.uint8)
cupy.cuda.get_current_stream().synchronize()
try:
    cupy.empty(2 << 30, dtype=cupy.uint8)
    out = {"raised": None}
except cupy.cuda.memory.OutOfMemoryError as e:
    err = cc.explain_oom(e)
    out = {"raised": str(e), "cause": err.cause, "op": err.op, "requested": err.requested, "by_library": err.by_library}
del a
print("RESULT " + json.dumps(out))
"""


def test_cupy_out_of_memory_in_the_shared_pool_gets_the_verdict_and_the_split() -> None:
    pytest.importorskip("cupy")
    r = _run(CUPY_OOM)
    assert r["raised"] is not None
    assert (r["cause"], r["op"], r["requested"]) == ("pool_max_size", "cupy", 2 << 30)
    by = r["by_library"]
    assert by["cupy (by difference)"] >= 256 * MiB and by["unattributed"] == 0


# -- RMM (carried as a wheel to the GPU machine) --------------------------------------------------------------

RMM_SHARED = r"""
import json
import math
import rmm
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, libraries=["rmm"])
base = dev.memory_stats()["pool_used"]
buf = rmm.DeviceBuffer(size=16 << 20)
stats = dev.memory_stats()
del buf
sp.undo()
print("RESULT " + json.dumps({"wired": sp.libraries["rmm"].wired, "how": sp.libraries["rmm"].how,
                              "base": base, "with_buf": stats["pool_used"], "by_library": stats["by_library"]}))
"""


def test_rmm_allocates_from_the_shared_pool_with_its_own_row() -> None:
    pytest.importorskip("rmm")
    r = _run(RMM_SHARED)
    assert r["wired"], r["how"]
    assert r["with_buf"] >= r["base"] + 16 * MiB
    assert r["by_library"]["rmm"] == 16 << 20


RMM_OOM = r"""
import json
import rmm
import cudacore as cc
sp = cc.share_pool(0, max_size=1 << 30, libraries=["rmm"])
buf = rmm.DeviceBuffer(size=256 << 20)
try:
    rmm.DeviceBuffer(size=2 << 30)
    out = {"raised": None}
except MemoryError as e:
    err = cc.explain_oom(e)
    out = {"raised": str(e), "cause": err.cause, "op": err.op, "requested": err.requested, "by_library": err.by_library}
del buf
print("RESULT " + json.dumps(out))
"""


def test_rmm_out_of_memory_in_the_shared_pool_gets_the_verdict_and_the_split() -> None:
    pytest.importorskip("rmm")
    r = _run(RMM_OOM)
    assert r["raised"] is not None and "out_of_memory" in r["raised"]
    assert (r["cause"], r["op"], r["requested"]) == ("pool_max_size", "rmm", 2 << 30)
    assert r["by_library"]["rmm"] == 256 * MiB


# -- Numba (cudacore's plug-in, by the environment variable share_pool sets) ------------------------------------

NUMBA_SHARED = r"""
import json
import math
import numpy as np
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, libraries=["numba"])
from numba import cuda
manager = type(cuda.current_context().memory_manager).__name__
a = cuda.to_device(np.zeros(4 << 20, dtype=np.uint8))
stats = dev.memory_stats()
del a
print("RESULT " + json.dumps({"wired": sp.libraries["numba"].wired, "manager": manager, "by_library": stats["by_library"]}))
"""


def test_numba_allocates_through_the_plug_in_in_the_shared_pool() -> None:
    pytest.importorskip("numba.cuda")
    r = _run(NUMBA_SHARED)
    assert r["wired"] and r["manager"] == "NumbaMemoryManager"
    assert r["by_library"]["numba"] == 4 << 20


# -- all of them in one process ------------------------------------------------------------------------------

ALL_IN_ONE = r"""
import importlib.util, json
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, release_threshold=None)
import torch, cupy
have_rmm = importlib.util.find_spec("rmm") is not None
held = []
base = dev.memory_stats()
held.append(torch.empty(48 << 20, dtype=torch.uint8, device="cuda"))
held.append(cupy.zeros(24 << 20, dtype=cupy.uint8))
held.append(dev.allocate(8 << 20))
if have_rmm:
    import rmm
    held.append(rmm.DeviceBuffer(size=16 << 20))
torch.cuda.synchronize(); cupy.cuda.get_current_stream().synchronize()
stats = dev.memory_stats()
print("RESULT " + json.dumps({
    "wired": list(sp.wired), "libraries": {k: [w.wired, w.how] for k, w in sp.libraries.items()}, "have_rmm": have_rmm,
    "base_used": base["pool_used"], "used": stats["pool_used"], "reserved": stats["reserved"],
    "by_library": stats["by_library"],
}))
"""


def test_torch_cupy_rmm_and_cudacore_share_one_pool() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    r = _run(ALL_IN_ONE)
    assert {"torch", "cupy"} <= set(r["wired"])
    asked = (48 + 24 + 8) * MiB + (16 * MiB if r["have_rmm"] else 0)
    grown = r["used"] - r["base_used"]
    assert asked <= grown <= asked + 8 * MiB, "every library's allocation is in the one pool (and nothing else is)"
    by = r["by_library"]
    assert by["cudacore"] >= 8 * MiB
    if r["have_rmm"]:
        assert by["rmm"] == 16 * MiB
    assert sum(by.values()) == r["used"]
    assert by["unattributed"] >= (48 + 24) * MiB, "PyTorch and CuPy both publish no count: nothing tells their bytes apart"


# The target for the verdict: PyTorch, CuPy, RMM and cudacore in one pool with a maximum size, and
# PyTorch runs out. PyTorch's message gives its count, CuPy is then the one library left without one (by
# difference), RMM and cudacore count theirs: at least 95% of the pool's use is attributed to named libraries.
ALL_OOM = r"""
import importlib.util, json
import cudacore as cc
dev = cc.Device(0)
sp = cc.share_pool(0, max_size=2 << 30)
import torch, cupy
have_rmm = importlib.util.find_spec("rmm") is not None
held = [torch.empty(512 << 20, dtype=torch.uint8, device="cuda"), cupy.zeros(256 << 20, dtype=cupy.uint8), dev.allocate(64 << 20)]
if have_rmm:
    import rmm
    held.append(rmm.DeviceBuffer(size=128 << 20))
torch.cuda.synchronize(); cupy.cuda.get_current_stream().synchronize()
used = dev.memory_stats()["pool_used"]
try:
    torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    out = {"raised": None}
except torch.OutOfMemoryError as e:
    err = cc.explain_oom(e)
    out = {"raised": str(e), "cause": err.cause, "by_library": err.by_library}
held[2].close()
out.update(used=used, have_rmm=have_rmm)
print("RESULT " + json.dumps(out))
"""


def test_the_verdict_attributes_the_shared_pool_to_named_libraries() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    r = _run(ALL_OOM)
    assert r["raised"] is not None and r["cause"] == "pool_max_size"
    by = r["by_library"]
    assert by["torch"] == 512 * MiB and by["cudacore"] >= 64 * MiB
    assert by["cupy (by difference)"] >= 256 * MiB
    if r["have_rmm"]:
        assert by["rmm"] == 128 * MiB
    named = sum(n for name, n in by.items() if name != "unattributed")
    assert named >= 0.95 * r["used"], by

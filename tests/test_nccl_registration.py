"""NCCL's user-buffer registration on the simulator: which path cudacore's memory takes
(``interop.nccl_memory_path``, from the driver's answers), and what ``nccl_mem_pool`` and
``register_nccl_pool`` do with PyTorch, stood in for here by a small fake of the calls they make (the real
PyTorch and NCCL run in tests/test_multi_gpu.py and examples/torchrun_allreduce.py on two GPUs)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import cudacore as cc
from cudacore import interop

pytestmark = pytest.mark.sim


@pytest.fixture
def strategy(dev: cc.Device, request: pytest.FixtureRequest) -> Iterator[str]:
    """Device 0 with the strategy the test is parametrized with; put back after."""
    before = dev.allocation_strategy
    dev.set_allocation_strategy(request.param)
    yield request.param
    dev.set_allocation_strategy(before)


@pytest.mark.parametrize(
    ("strategy", "legacy_env", "path", "in_reason"),
    [
        ("pool", None, "copy", "stream-ordered pool (the pool strategy)"),
        ("pool", "1", "copy", "CUDACORE_ALLOCATOR=sync with NCCL_LEGACY_CUDA_REGISTER=1"),
        ("sync", None, "copy", "only with NCCL_LEGACY_CUDA_REGISTER=1"),
        ("sync", "0", "copy", "only with NCCL_LEGACY_CUDA_REGISTER=1"),
        ("sync", "1", "legacy_ipc", "through cuIpc handles"),
    ],
    indirect=["strategy"],
)
def test_nccl_memory_path_follows_the_driver(
    dev: cc.Device, strategy: str, legacy_env: str | None, path: str, in_reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if legacy_env is None:
        monkeypatch.delenv("NCCL_LEGACY_CUDA_REGISTER", raising=False)
    else:
        monkeypatch.setenv("NCCL_LEGACY_CUDA_REGISTER", legacy_env)
    in_use = dev.memory_stats()["in_use"]
    got = interop.nccl_memory_path(dev)
    assert got.path == path and got.zero_copy == (path != "copy")
    assert in_reason in got.reason
    assert got.memory["legacy_ipc"] == (strategy == "sync")
    assert "cuMemRetainAllocationHandle: CUDA_ERROR_INVALID_VALUE" in got.memory["retain"]
    assert dev.memory_stats()["in_use"] == in_use, "the probe's block is freed"


def test_nccl_memory_path_refuses_a_device_it_lacks() -> None:
    with pytest.raises(cc.InvalidValueError):
        interop.nccl_memory_path(7)


# -- nccl_mem_pool and register_nccl_pool against a stand-in of PyTorch ---------------------------------------


class FakeBackend:
    def __init__(self) -> None:
        self.registered: list[Any] = []

    def register_mem_pool(self, pool: Any) -> None:
        self.registered.append(pool)

    def deregister_mem_pool(self, pool: Any) -> None:
        self.registered.remove(pool)


class FakeGroup:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def _get_backend(self, device: Any) -> Any:
        if self.backend is None:
            raise RuntimeError(f"No backend type associated with device type {device}")
        return self.backend


def fake_torch(*, mem_pool: bool = True, backend: str = "native", nccl: tuple[int, int, int] | int = (2, 27, 5), group: Any = None) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    made: list[Any] = []

    class MemPool:
        def __init__(self, allocator: Any) -> None:
            self.allocator = allocator
            self.device = torch.cuda.current
            made.append(self)

    class Device:
        def __init__(self, ordinal: int) -> None:
            self.ordinal = ordinal

        def __enter__(self) -> None:
            self.before, torch.cuda.current = torch.cuda.current, self.ordinal

        def __exit__(self, *exc: object) -> None:
            torch.cuda.current = self.before

    class Pluggable:
        def __init__(self, path: str, alloc: str, free: str) -> None:
            self.names = (alloc, free)

        def allocator(self) -> tuple[str, str]:
            return self.names

    cuda = types.SimpleNamespace(
        current=0,
        device=Device,
        get_allocator_backend=lambda: backend,
        current_device=lambda: torch.cuda.current,
        nccl=types.SimpleNamespace(version=lambda: nccl),
        memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable),
        made=made,
    )
    if mem_pool:
        cuda.MemPool = MemPool
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch.device = lambda kind, index: (kind, index)  # type: ignore[attr-defined]
    distributed = types.ModuleType("torch.distributed")
    distributed.group = types.SimpleNamespace(WORLD=group if group is not None else FakeGroup(FakeBackend()))  # type: ignore[attr-defined]
    torch.distributed = distributed  # type: ignore[attr-defined]
    return torch


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Any:
    def put(torch: types.ModuleType) -> types.ModuleType:
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
        return torch

    return put


def test_nccl_mem_pool_is_made_with_cudacores_allocator_on_its_device(install: Any) -> None:
    torch = install(fake_torch())
    pool = interop.nccl_mem_pool(0)
    assert pool.allocator == ("cudacore_torch_alloc", "cudacore_torch_free")
    assert pool.device == 0 and torch.cuda.current == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mem_pool": False}, "has no torch.cuda.MemPool"),
        ({"backend": "pluggable"}, "PyTorch allocates with its 'pluggable' allocator"),
        ({"backend": "cudaMallocAsync"}, "no backend:cudaMallocAsync"),
    ],
)
def test_nccl_mem_pool_refuses_what_pytorch_cannot(install: Any, kwargs: dict[str, Any], message: str) -> None:
    install(fake_torch(**kwargs))
    with pytest.raises(cc.NotSupportedError, match=message):
        interop.nccl_mem_pool(0)


@pytest.mark.parametrize(
    ("strategy", "legacy_env", "nccl", "registered", "path"),
    [
        ("pool", "1", (2, 27, 5), False, "copy"),
        ("sync", None, (2, 27, 5), False, "copy"),
        ("sync", "1", (2, 27, 5), True, "legacy_ipc"),
        ("sync", "1", (2, 21, 5), False, "copy"),
        ("sync", "1", 22705, True, "legacy_ipc"),
        ("sync", "1", 22105, False, "copy"),
    ],
    indirect=["strategy"],
)
def test_register_nccl_pool_registers_only_what_nccl_can_take(
    install: Any, strategy: str, legacy_env: str | None, nccl: tuple[int, int, int] | int, registered: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if legacy_env is None:
        monkeypatch.delenv("NCCL_LEGACY_CUDA_REGISTER", raising=False)
    else:
        monkeypatch.setenv("NCCL_LEGACY_CUDA_REGISTER", legacy_env)
    backend = FakeBackend()
    install(fake_torch(nccl=nccl, group=FakeGroup(backend)))
    pool = interop.nccl_mem_pool(0)
    reg = interop.register_nccl_pool(pool)
    assert (reg.registered, reg.path.path) == (registered, path)
    assert backend.registered == ([pool] if registered else [])
    if not registered and strategy == "sync" and legacy_env == "1":
        assert "from 2.23 on" in reg.path.reason
    assert ("registered with NCCL" if registered else "not registered") in str(reg)
    reg.deregister()
    reg.deregister()  # idempotent
    assert backend.registered == [] and not reg.registered


@pytest.mark.parametrize(("backend", "message"), [(None, "has no CUDA backend for device 0"), (object(), "has no register_mem_pool")])
def test_register_nccl_pool_refuses_a_group_without_nccl(install: Any, backend: Any, message: str) -> None:
    install(fake_torch(group=FakeGroup(backend)))
    pool = interop.nccl_mem_pool(0)
    with pytest.raises(cc.NotSupportedError, match=message):
        interop.register_nccl_pool(pool)

"""One pool for every library of the process (cudacore.share_pool), on the simulator and on a GPU.

The libraries that share the pool are stood in for here by the simulator's doors that allocate the way
they do (``SimPoolAllocate``: from the device's current pool, as PyTorch's cudaMallocAsync backend and
CuPy's MemoryAsyncPool do, or from the pool by handle, as RMM does); the wiring of the real libraries is
tested on the GPU machine (tests/test_one_pool_gpu.py).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import cudacore as cc
import one_pool_standins as standin
from cudacore import _accounts, _broker, _errors, _explain
from cudacore._api import core

from conftest import run_python

MiB = 1 << 20


@pytest.fixture
def dev() -> Iterator[cc.Device]:
    """Device 0 with no shared pool and nothing of cudacore's allocated, before and after the test."""
    d = cc.Device(0)
    assert cc.shared_pool(d) is None
    assert d.memory_stats()["in_use"] == 0
    yield d
    sp = cc.shared_pool(d)
    if sp is not None:
        sp.undo()
    assert json.loads(core.PoolInfo(0))["shared"] is None


def current_pool(d: cc.Device) -> int:
    return int(json.loads(core.PoolInfo(d.device_id))["current"])


class StandIn:
    """Another library of the process, allocating natively from the pool: from the device's current pool
    (``by_handle`` None), or from a pool it was handed."""

    def __init__(self, d: cc.Device, by_handle: int | None = None) -> None:
        self.d, self.pool, self.live = d, by_handle or 0, {}

    def allocate(self, n: int) -> int:
        p = core.SimPoolAllocate(self.d.device_id, n, self.pool)
        self.live[p] = n
        return p

    def free_all(self) -> None:
        for p in list(self.live):
            core.SimPoolFree(self.d.device_id, p)
            del self.live[p]

    def bytes_in_use(self) -> int:
        return sum(self.live.values())


# -- the call ----------------------------------------------------------------------------------------------


def test_share_pool_makes_one_pool_current_and_puts_it_back(dev: cc.Device) -> None:
    before = current_pool(dev)
    with cc.share_pool(dev, release_threshold=64 * MiB, libraries=[]) as sp:
        assert cc.shared_pool(dev) is sp and cc.shared_pool(0) is sp
        assert sp.owned and sp.device == dev and sp.previous_pool == before
        assert sp.handle != before and current_pool(dev) == sp.handle
        assert sp.release_threshold == 64 * MiB and sp.max_size is None and not sp.ipc
        assert sp.libraries == {} and sp.wired == ()
        assert dev.memory_stats()["pool_shared"] is True
        with dev.allocate(2 * MiB) as buf:
            stats = dev.memory_stats()
            assert stats["pool_used"] >= 2 * MiB and stats["by_library"]["cudacore"] >= 2 * MiB
            with pytest.raises(cc.IllegalStateError, match="close those buffers first"):
                sp.undo()  # cudacore's block is in the pool: nothing changes
            assert current_pool(dev) == sp.handle and not sp.closed
            assert buf.ptr
    assert sp.closed and cc.shared_pool(dev) is None
    assert current_pool(dev) == before
    assert dev.memory_stats()["pool_shared"] is False
    sp.undo()  # idempotent
    assert "undone" in repr(sp)


def test_sharing_again_changes_the_threshold_or_is_refused(dev: cc.Device) -> None:
    sp = cc.share_pool(dev, libraries=[])
    assert sp.release_threshold is None
    again = cc.share_pool(dev, release_threshold=0, libraries=[])
    assert again is sp and sp.release_threshold == 0
    with pytest.raises(cc.IllegalStateError, match="already shares memory pool"):
        cc.share_pool(dev, pool="default", libraries=[])
    assert cc.shared_pool(dev) is sp and current_pool(dev) == sp.handle
    sp.undo()


def test_the_default_pool_can_be_shared(dev: cc.Device) -> None:
    with dev.allocate(MiB):  # the allocator is in the default pool already: its blocks may stay
        sp = cc.share_pool(dev, pool="default", release_threshold=8 * MiB, libraries=[])
        assert not sp.owned and current_pool(dev) == sp.handle
        assert "the default pool" in repr(sp)
        sp.undo()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"release_threshold": -1}, cc.InvalidValueError, "release_threshold must be 0 or more"),
        ({"release_threshold": 1 << 64}, cc.InvalidValueError, "below 2\\*\\*63"),
        ({"release_threshold": "1GiB"}, TypeError, "release_threshold must be an int"),
        ({"release_threshold": True}, TypeError, "not bool"),
        ({"max_size": 0}, cc.InvalidValueError, "max_size must be positive"),
        ({"max_size": -5}, cc.InvalidValueError, "max_size must be positive"),
        ({"max_size": 1.5}, TypeError, "max_size must be an int"),
        ({"ipc": "yes"}, TypeError, "ipc must be a bool"),
        ({"pool": "mine"}, cc.InvalidValueError, 'pool must be "own" or "default"'),
        ({"libraries": "torch"}, TypeError, "a list of names"),
        ({"libraries": ["tensorflow"]}, cc.InvalidValueError, "cannot wire 'tensorflow'"),
        ({"pool": "default", "max_size": 1 << 30}, cc.InvalidValueError, "no maximum size and no IPC"),
        ({"pool": "default", "ipc": True}, cc.InvalidValueError, "no maximum size and no IPC"),
        ({"device": -1}, cc.InvalidValueError, "device ordinal must be >= 0"),
        ({"device": "0"}, TypeError, "device ordinal must be an int"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(dev: cc.Device, kwargs: dict[str, Any], error: type, match: str) -> None:
    before = current_pool(dev)
    kwargs.setdefault("libraries", [])
    with pytest.raises(error, match=match):
        cc.share_pool(**kwargs)
    assert cc.shared_pool(dev) is None and current_pool(dev) == before


def test_refused_while_cudacore_has_memory_in_the_old_pool(dev: cc.Device) -> None:
    before = current_pool(dev)
    with dev.allocate(MiB), pytest.raises(cc.IllegalStateError, match="close those buffers first"):
        cc.share_pool(dev, libraries=[])
    assert cc.shared_pool(dev) is None and current_pool(dev) == before


def test_refused_during_a_capture(dev: cc.Device) -> None:
    s = dev.create_stream()
    try:
        with s.capture(mode="relaxed"), pytest.raises(cc.CaptureError, match="capture"):
            cc.share_pool(dev, libraries=[])
    finally:
        s.close()
    assert cc.shared_pool(dev) is None


def test_the_synchronous_strategy_is_refused_both_ways(dev: cc.Device) -> None:
    dev.set_allocation_strategy("sync")
    try:
        with pytest.raises(cc.NotSupportedError, match="cupy_allocator"):
            cc.share_pool(dev, libraries=[])
    finally:
        dev.set_allocation_strategy("auto")
    sp = cc.share_pool(dev, libraries=[])
    with pytest.raises(cc.IllegalStateError, match="undo the shared pool first"):
        dev.set_allocation_strategy("sync")
    dev.set_allocation_strategy("pool")  # stays in the shared pool
    assert current_pool(dev) == sp.handle
    sp.undo()


@pytest.mark.sim
def test_devices_without_pools_get_a_clear_not_supported() -> None:
    code = """
import cudacore as cc
try:
    cc.share_pool(0, libraries=[])
except cc.NotSupportedError as e:
    print("NotSupported:", e)
"""
    devices = [{"name": "sim-tcc", "total_memory": 1 << 30, "memory_pools_supported": False, "tcc_driver": True}]
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": json.dumps(devices)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NotSupported:"), r.stdout
    assert "no stream-ordered memory pools" in r.stdout and "TCC" in r.stdout
    assert "cudacore.interop.cupy_allocator" in r.stdout


def test_a_maximum_size_caps_the_pool(dev: cc.Device) -> None:
    with cc.share_pool(dev, max_size=64 * MiB, release_threshold=0, libraries=[]) as sp:
        assert sp.max_size == 64 * MiB
        with dev.allocate(48 * MiB):
            with pytest.raises(cc.OutOfMemoryError) as e:
                dev.allocate(32 * MiB)
            assert e.value.cause == "pool_max_size" and int(e.value.fields["max_size"]) == 64 * MiB
            assert "the pool reached its maximum size" in str(e.value)
            assert dev.memory_stats()["reserved"] <= 64 * MiB
        dev.synchronize()
        dev.allocate(60 * MiB).close()  # the freed block made room again


def test_an_ipc_pool(dev: cc.Device) -> None:
    with cc.share_pool(dev, ipc=True, libraries=[]) as sp:
        assert sp.ipc and current_pool(dev) == sp.handle
        dev.allocate(MiB).close()


# -- the account -------------------------------------------------------------------------------------------


@pytest.mark.sim
def test_the_pool_serves_every_library_and_the_account_splits_it(dev: cc.Device) -> None:
    sp = cc.share_pool(dev, libraries=[])
    current = StandIn(dev)  # allocates with cuMemAllocAsync, as PyTorch's and CuPy's async allocators do
    handed = StandIn(dev, by_handle=sp.handle)  # from the pool by handle, as RMM does
    sp.track("standin", handed.bytes_in_use)
    try:
        buf = dev.allocate(5 * MiB)
        current.allocate(3 * MiB)
        handed.allocate(7 * MiB)
        handed.allocate(MiB)
        stats = dev.memory_stats()
        assert stats["pool_used"] == 16 * MiB, "every library's blocks are in the one pool"
        assert stats["by_library"] == {"cudacore": 5 * MiB, "standin": 8 * MiB, "unattributed": 3 * MiB}
        assert sum(stats["by_library"].values()) == stats["pool_used"]
        summary = cc.memory_summary(dev, events=0)
        assert "shared with the process's libraries" in summary and "standin" in summary and "unattributed" in summary
        with pytest.raises(cc.InvalidValueError, match="cannot name a row"):
            sp.track("standin", handed.bytes_in_use)
        with pytest.raises(cc.InvalidValueError, match="cannot name a row"):
            sp.track("unattributed", handed.bytes_in_use)
        with pytest.raises(TypeError, match="callable"):
            sp.track("other", 5)  # type: ignore[arg-type]
        buf.close()
        # A release gives back what every library freed, not only cudacore's cache.
        current.free_all()
        dev.synchronize()
        assert dev.release_cached_memory() == 0
        assert dev.memory_stats()["reserved"] == 8 * MiB, "only the handed-out blocks stay"
    finally:
        current.free_all()
        handed.free_all()
        sp.undo()
    assert "standin" not in dev.memory_stats()["by_library"], "undo removes the tracked row"
    with pytest.raises(cc.IllegalStateError, match="was undone"):
        sp.track("late", handed.bytes_in_use)


@pytest.mark.sim
def test_undo_leaves_other_libraries_blocks_valid(dev: cc.Device) -> None:
    sp = cc.share_pool(dev, libraries=[])
    other = StandIn(dev)
    p = other.allocate(2 * MiB)
    sp.undo()  # the pool is destroyed with a block of another library in it
    assert current_pool(dev) == sp.previous_pool
    core.SimPoolFree(0, p)  # which its owner frees later, as the driver allows
    other.live.clear()


C10 = {"cudacore": 10}  # cudacore's row, as Go sends it


@pytest.mark.parametrize(
    ("held", "inside", "outside", "uncounted", "known", "used", "want"),
    [
        ({}, {}, {}, {}, {}, 0, {}),  # no pool: the synchronous strategy
        ({}, {}, {}, {"torch": True}, {}, 0, {}),
        (C10, {}, {}, {}, {}, 10, {"cudacore": 10, "unattributed": 0}),
        (C10, {}, {}, {}, {}, 25, {"cudacore": 10, "unattributed": 15}),
        (C10, {"numba": 4}, {}, {}, {}, 10, {"cudacore": 6, "numba": 4, "unattributed": 0}),
        (C10, {}, {"rmm": 7}, {}, {}, 20, {"cudacore": 10, "rmm": 7, "unattributed": 3}),
        # More named than used (cudacore's allocations inside captures are graph memory, outside the pool):
        # unattributed never goes below 0.
        (C10, {}, {"rmm": 7}, {}, {}, 12, {"cudacore": 10, "rmm": 7, "unattributed": 0}),
        # A failing reporter, or one answering no byte count, leaves its bytes unattributed.
        (C10, {}, {"broken": None, "silly": "x"}, {}, {}, 20, {"cudacore": 10, "unattributed": 10}),
        # The one library drawing from the pool without a count takes the remainder, said to be by difference.
        (C10, {}, {"rmm": 7}, {"torch": True}, {}, 30, {"cudacore": 10, "rmm": 7, "torch (by difference)": 13, "unattributed": 0}),
        (C10, {}, {}, {"torch": True}, {}, 10, {"cudacore": 10, "torch (by difference)": 0, "unattributed": 0}),
        (C10, {}, {}, {"torch": True, "cupy": False}, {}, 25, {"cudacore": 10, "torch (by difference)": 15, "unattributed": 0}),
        (C10, {}, {}, {"torch": True, "cupy": None}, {}, 25, {"cudacore": 10, "torch (by difference)": 15, "unattributed": 0}),
        # Two of them: no count tells them apart.
        (C10, {}, {"rmm": 7}, {"torch": True, "cupy": True}, {}, 30, {"cudacore": 10, "rmm": 7, "unattributed": 13}),
        # A count supersedes: the failure's own (PyTorch's message), or the library's statistics.
        (C10, {}, {"rmm": 7}, {"torch": True, "cupy": True}, {"torch": 8}, 30,
         {"cudacore": 10, "rmm": 7, "torch": 8, "cupy (by difference)": 5, "unattributed": 0}),
        (C10, {}, {"torch": 4}, {"torch": True}, {}, 30, {"cudacore": 10, "torch": 4, "unattributed": 16}),
    ],
)
def test_the_split(held: dict[str, int], inside: dict[str, int], outside: dict[str, Any], uncounted: dict[str, bool | None],
                   known: dict[str, int], used: int, want: dict[str, int]) -> None:
    ordinal = 1000  # no device of the process: the books are this test's alone
    for name, n in inside.items():
        _accounts.count_inside(ordinal, name, n)
    for name, value in outside.items():

        def report(value: Any = value) -> int:
            if value is None:
                raise RuntimeError("statistics unavailable")
            return value

        _accounts.report_outside(ordinal, name, report)
    for name, drawing in uncounted.items():

        def draws(drawing: bool | None = drawing) -> bool:
            if drawing is None:
                raise RuntimeError("the library cannot say")
            return drawing

        _accounts.report_uncounted(ordinal, name, draws)
    try:
        assert _accounts.split(ordinal, used, held, known) == want
    finally:
        for name, n in inside.items():
            _accounts.count_inside(ordinal, name, -n)
        for name in outside:
            _accounts.report_outside(ordinal, name, None)
        for name in uncounted:
            _accounts.report_uncounted(ordinal, name, None)


# -- wiring, before the libraries are imported -------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch and numba taken as installed but not imported, so that share_pool wires them through the
    environment (neither is imported here)."""
    real = _broker._installed
    monkeypatch.setattr(_broker, "_installed", lambda name: name in ("torch", "numba") or real(name))
    for var in (*_broker._TORCH_CONF, _broker._NUMBA_ENV):
        monkeypatch.delenv(var, raising=False)
    yield


def _skip_if_imported(*names: str) -> None:
    """Skip when an earlier test of this process imported one of ``names``: checked when the test runs,
    not when it is collected (a skipif condition is evaluated at collection, before the GPU tests that
    import torch have run)."""
    imported = [n for n in names if n in sys.modules]
    if imported:
        pytest.skip(f"{' and '.join(imported)} imported in this process already")


def test_torch_and_numba_are_wired_through_the_environment_before_import(dev: cc.Device, installed: None) -> None:
    _skip_if_imported("torch", "numba")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    sp = cc.share_pool(dev, libraries=["torch", "numba"])
    assert sp.wired == ("torch", "numba")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False,backend:cudaMallocAsync"
    assert os.environ["NUMBA_CUDA_MEMORY_MANAGER"] == "cudacore.interop"
    assert "imported after this" in sp.libraries["torch"].how
    sp.undo()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert "NUMBA_CUDA_MEMORY_MANAGER" not in os.environ


def test_torch_asked_for_another_backend_is_not_wired(dev: cc.Device, installed: None) -> None:
    _skip_if_imported("torch")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native"
    with cc.share_pool(dev, libraries=["torch"]) as sp:
        w = sp.libraries["torch"]
        assert not w.wired and "'native'" in w.how and "backend:cudaMallocAsync" in w.how
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native", "the user's choice is left alone"


def test_libraries_not_installed_are_reported(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_broker, "_installed", lambda name: False)
    with cc.share_pool(dev) as sp:
        assert set(sp.libraries) == set(_broker.LIBRARIES)
        assert all(not w.wired and w.how == "not installed" for w in sp.libraries.values())


def test_a_library_whose_wiring_fails_is_reported_and_the_rest_goes_on(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(pool: Any) -> Any:
        raise RuntimeError("the library refused")

    monkeypatch.setattr(_broker, "_installed", lambda name: name == "rmm")
    monkeypatch.setitem(_broker._WIRE, "rmm", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sp = cc.share_pool(dev, libraries=["rmm"])
    try:
        assert not sp.libraries["rmm"].wired and "the library refused" in sp.libraries["rmm"].how
        assert any("could not wire rmm" in str(w.message) for w in caught)
        assert current_pool(dev) == sp.handle, "the pool is shared all the same"
    finally:
        sp.undo()


# -- libraries without a count, and their out-of-memory errors (stand-ins: tests/one_pool_standins.py) -------


@pytest.fixture
def standins(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[standin.Torch, standin.Cupy]]:
    """The torch and cupy stand-ins, imported (in sys.modules); their blocks freed at the end."""
    torch, cupy = standin.Torch(), standin.Cupy()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_broker, "_installed", lambda name: name in ("torch", "cupy"))
    try:
        yield torch, cupy
    finally:
        torch.free_all()
        cupy.library.free_all()


@pytest.mark.sim
def test_one_library_without_a_count_takes_the_remainder_by_difference(dev: cc.Device, standins: tuple[standin.Torch, standin.Cupy]) -> None:
    torch, cupy = standins
    sp = cc.share_pool(dev, libraries=["torch"])
    try:
        assert sp.wired == ("torch",)
        buf = dev.allocate(4 * MiB)
        torch.empty(6 * MiB)
        by = dev.memory_stats()["by_library"]
        assert by == {"cudacore": 4 * MiB, "torch (by difference)": 6 * MiB, "unattributed": 0}
        # CuPy wired too: two libraries without a count, which nothing tells apart.
        cc.share_pool(dev, libraries=["cupy"])
        assert sp.wired == ("torch", "cupy")
        cupy.alloc(3 * MiB)
        by = dev.memory_stats()["by_library"]
        assert by == {"cudacore": 4 * MiB, "unattributed": 9 * MiB}
        # CuPy given another allocator no longer draws from the pool: PyTorch is alone again, and the
        # blocks CuPy still holds there fall into its remainder (said to be by difference).
        cupy.cuda.set_allocator(lambda n: 0)
        assert dev.memory_stats()["by_library"]["torch (by difference)"] == 9 * MiB
        cupy.cuda.set_allocator(sp._keep[-1].malloc)
        # A library whose count is known is never taken by difference.
        sp.track("torch", torch.bytes_in_use)
        by = dev.memory_stats()["by_library"]
        assert by == {"cudacore": 4 * MiB, "torch": 6 * MiB, "cupy (by difference)": 3 * MiB, "unattributed": 0}
        assert "by difference" in cc.memory_summary(dev, events=0)
        buf.close()
    finally:
        torch.free_all()
        cupy.library.free_all()
        sp.undo()
    assert _accounts.uncounted(0) == [] and _accounts.reporters(0) == [], "undo forgets every row"


@pytest.mark.sim
def test_a_tracked_library_without_a_count(dev: cc.Device) -> None:
    with cc.share_pool(dev, libraries=[]) as sp:
        mine = StandIn(dev)
        sp.track("mylib")
        mine.allocate(5 * MiB)
        try:
            assert dev.memory_stats()["by_library"] == {"cudacore": 0, "mylib (by difference)": 5 * MiB, "unattributed": 0}
            with pytest.raises(cc.InvalidValueError, match="cannot name a row"):
                sp.track("mylib")  # declared already
            with pytest.raises(cc.InvalidValueError, match="cannot name a row"):
                sp.track("x (by difference)", mine.bytes_in_use)
            sp.track("mylib", mine.bytes_in_use)  # a count supersedes
            assert dev.memory_stats()["by_library"] == {"cudacore": 0, "mylib": 5 * MiB, "unattributed": 0}
        finally:
            mine.free_all()


@pytest.mark.sim
def test_an_out_of_memory_error_of_each_library_gets_the_verdict_and_the_split(
    dev: cc.Device, standins: tuple[standin.Torch, standin.Cupy]
) -> None:
    torch, cupy = standins
    sp = cc.share_pool(dev, max_size=64 * MiB, libraries=["torch", "cupy"])
    rmm = standin.Rmm(pool=sp.handle)
    sp.track("rmm", rmm.bytes_in_use)
    buf = dev.allocate(8 * MiB)
    try:
        torch.empty(16 * MiB)
        cupy.alloc(8 * MiB)
        rmm.allocate(8 * MiB)
        assert dev.memory_stats()["by_library"] == {"cudacore": 8 * MiB, "rmm": 8 * MiB, "unattributed": 24 * MiB}

        with pytest.raises(standin.TorchOutOfMemoryError) as caught:
            torch.empty(40 * MiB)
        e = cc.explain_oom(caught.value)
        assert isinstance(e, cc.OutOfMemoryError) and isinstance(e, MemoryError)
        assert e.cause == "pool_max_size" and e.op == "torch" and e.requested == 40 * MiB and e.device == 0
        assert e.pool_others == 32 * MiB, "PyTorch's, CuPy's and RMM's blocks in the pool are this process's"
        # PyTorch's own count, from its message, is its row; CuPy is then the one library left without one.
        assert e.by_library == {"cudacore": 8 * MiB, "rmm": 8 * MiB, "torch": 16 * MiB, "cupy (by difference)": 8 * MiB,
                                "unattributed": 0}
        assert str(e).startswith("the pool reached its maximum size: out of memory allocating 40.0 MiB")
        assert "the process's other libraries 32.0 MiB in the same pool" in str(e)
        assert str(e).endswith("By library, the shared pool's 40.0 MiB in use: cudacore 8.0 MiB, rmm 8.0 MiB, "
                               "torch 16.0 MiB, cupy (by difference) 8.0 MiB, unattributed 0 B.")
        again = pickle.loads(pickle.dumps(e))
        assert again.by_library == e.by_library and str(again) == str(e)

        with pytest.raises(standin.CupyOutOfMemoryError) as caught_cupy:
            cupy.alloc(40 * MiB)
        e = cc.explain_oom(caught_cupy.value)
        assert (e.cause, e.op, e.requested) == ("pool_max_size", "cupy", 40 * MiB)
        assert e.by_library == {"cudacore": 8 * MiB, "rmm": 8 * MiB, "unattributed": 24 * MiB}, "CuPy's error carries no count"

        with pytest.raises(MemoryError) as caught_rmm:
            rmm.allocate(40 * MiB)
        e = cc.explain_oom(caught_rmm.value)
        assert (e.cause, e.op, e.requested) == ("pool_max_size", "rmm", 40 * MiB)

        # Re-raised by the caller's code: the library's error is the cause, and is found there.
        try:
            try:
                torch.empty(40 * MiB)
            except standin.TorchOutOfMemoryError as inner:
                raise RuntimeError("the training step failed") from inner
        except RuntimeError as outer:
            assert cc.explain_oom(outer).op == "torch"

        # CuPy's runtime error of cudaErrorMemoryAllocation says no size: the caller gives it.
        with pytest.raises(cc.InvalidValueError, match="pass requested="):
            cc.explain_oom(standin.CUDARuntimeError(2))
        e = cc.explain_oom(standin.CUDARuntimeError(2), requested=40 * MiB)
        assert (e.cause, e.op) == ("pool_max_size", "cupy")
        assert cc.explain_oom(caught.value, requested=MiB).cause == "pool_reservation", "the size given is the one judged"

        # cudacore's own error carries the split from the start, and is explained as it is.
        with pytest.raises(cc.OutOfMemoryError) as own:
            dev.allocate(40 * MiB)
        assert own.value.cause == "pool_max_size" and own.value.by_library["unattributed"] == 24 * MiB
        assert str(own.value).endswith("unattributed 24.0 MiB.")
        assert cc.explain_oom(own.value) is own.value
    finally:
        buf.close()
        rmm.free_all()
        torch.free_all()
        cupy.library.free_all()
        sp.undo()
    with pytest.raises(cc.OutOfMemoryError) as unshared:
        dev.allocate(1 << 50)
    assert unshared.value.by_library == {} and "By library" not in str(unshared.value), "no split without a shared pool"


@pytest.mark.sim
def test_the_other_libraries_in_the_pool_are_not_other_processes(dev: cc.Device) -> None:
    with cc.share_pool(dev, libraries=[]):
        other = StandIn(dev)
        other.allocate(8 << 30)  # PyTorch, say, holds 8 GiB of the pool
        try:
            free, _ = dev.memory_info()
            with pytest.raises(cc.OutOfMemoryError) as e:
                dev.allocate(free + MiB)
            assert e.value.cause == "exhausted", str(e.value)
            assert e.value.pool_others == 8 << 30
            assert "the process's other libraries 8.0 GiB in the same pool" in str(e.value)
            assert e.value.by_library == {"cudacore": 0, "unattributed": 8 << 30}
        finally:
            other.free_all()


@pytest.mark.parametrize(
    ("exc", "kwargs", "error", "match"),
    [
        ("not an exception", {}, TypeError, "takes the exception caught"),
        (ValueError("bad value"), {}, TypeError, "builtins.ValueError is none of them: 'bad value'"),
        (MemoryError("Unable to allocate 8.00 GiB for an array"), {}, TypeError, "is none of them"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), {}, TypeError, "is none of them"),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error at: x.cpp:1"), {}, cc.InvalidValueError, "pass requested="),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error at: x.cpp:1"), {"requested": 0}, cc.InvalidValueError, "positive"),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error at: x.cpp:1"), {"requested": -5}, cc.InvalidValueError, "positive"),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error at: x.cpp:1"), {"requested": "1 GiB"}, TypeError, "requested must be an int"),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error at: x.cpp:1"), {"requested": True}, TypeError, "requested must be an int"),
        (MemoryError("std::bad_alloc: out_of_memory: CUDA error (failed to allocate 64 bytes) at: x"), {"device": -1},
         cc.InvalidValueError, "device ordinal must be >= 0"),
    ],
)
def test_explain_oom_refuses_what_it_cannot_explain(exc: Any, kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        cc.explain_oom(exc, **kwargs)


class _UnprintableMemoryError(MemoryError):
    def __str__(self) -> str:
        raise RuntimeError("__str__ raises")


class _LyingCause(Exception):
    """An error whose __cause__ is not an exception."""

    @property  # type: ignore[override]
    def __cause__(self) -> Any:
        return 5


class _RaisingCause(Exception):
    """An error whose __cause__ raises when read."""

    @property  # type: ignore[override]
    def __cause__(self) -> Any:
        raise RuntimeError("__cause__ raises")


def _rmm(text: str) -> MemoryError:
    return MemoryError(f"std::bad_alloc: out_of_memory: CUDA error ({text}) at: x")


@pytest.mark.parametrize(
    ("exc", "error", "match"),
    [
        (_UnprintableMemoryError(), TypeError, "is none of them"),
        (_LyingCause("not an out-of-memory error"), TypeError, "is none of them"),
        (_RaisingCause("not an out-of-memory error"), TypeError, "is none of them"),
        (_rmm("failed to allocate " + "9" * 5000 + " bytes"), cc.InvalidValueError, "pass requested="),
        (_rmm("failed to allocate " + "9" * 30 + " bytes"), cc.InvalidValueError, "pass requested="),
    ],
    ids=["str raises", "__cause__ not an exception", "__cause__ raises", "5000 digits", "30 digits"],
)
def test_explain_oom_refuses_a_hostile_error_with_a_typed_error(exc: BaseException, error: type, match: str) -> None:
    """What the error is made of is the caller's: a __str__ or __cause__ that raises or lies, or a size no
    allocation can have, is refused with cudacore's typed errors, not the error's own (RuntimeError,
    AttributeError) nor Python's limits on int and float conversion (ValueError, OverflowError)."""
    with pytest.raises(error, match=match):
        cc.explain_oom(exc)


@pytest.mark.sim
def test_explain_oom_reads_what_it_can_of_a_hostile_torch_error(dev: cc.Device, standins: tuple[standin.Torch, standin.Cupy]) -> None:
    """A PyTorch error whose sizes are past any float, or whose text cannot be read: the size is asked of
    the caller, and a count past any float is left out of the split, with the verdict given."""

    class Unprintable(standin.TorchOutOfMemoryError):
        def __str__(self) -> str:
            raise RuntimeError("__str__ raises")

    huge = "9" * 400
    with cc.share_pool(dev, libraries=[]):
        for exc in (standin.TorchOutOfMemoryError(f"Requested : {huge} GiB"), Unprintable()):
            with pytest.raises(cc.InvalidValueError, match="pass requested="):
                cc.explain_oom(exc)
        e = cc.explain_oom(Unprintable(), requested=MiB)
        assert (e.op, e.requested) == ("torch", MiB)
        e = cc.explain_oom(standin.TorchOutOfMemoryError(f"Requested : 1.00 MiB\nCurrently allocated : {huge} GiB"))
        assert (e.op, e.requested) == ("torch", MiB) and "torch" not in e.by_library
        e = cc.explain_oom(standin.TorchOutOfMemoryError(f"Allocation on device {huge} would exceed\nRequested : 1.00 MiB"))
        assert e.device == 0, "a device past any ordinal is not the error's: the current device"
        for size in ("9" * 20 + " GiB", "9" * 19 + " GiB"):  # no allocation asks for these: not judged
            with pytest.raises(cc.InvalidValueError, match="pass requested="):
                cc.explain_oom(standin.TorchOutOfMemoryError(f"Requested : {size}"))


@pytest.mark.sim
def test_explain_oom_reads_what_it_can_of_a_hostile_cupy_error(dev: cc.Device, standins: tuple[standin.Torch, standin.Cupy]) -> None:
    """A CuPy error whose size attribute is missing or raises when read, and whose text has commas where
    the digits go: the size is asked of the caller (this raised the attribute's own RuntimeError, or
    ValueError from int("")), and the text's size is read when there is one."""

    class RaisingSize(standin.CupyOutOfMemoryError):
        @property
        def _size(self) -> Any:
            raise RuntimeError("_size raises")

        @_size.setter
        def _size(self, value: Any) -> None:
            pass

    def without_size(text: str) -> standin.CupyOutOfMemoryError:
        exc = standin.CupyOutOfMemoryError(1, 0)
        exc._size, exc.args = None, (text,)
        return exc

    with cc.share_pool(dev, libraries=[]):
        for exc in (without_size("Out of memory allocating , bytes"), without_size("Out of memory allocating ,,, bytes")):
            with pytest.raises(cc.InvalidValueError, match="pass requested="):
                cc.explain_oom(exc)
        e = cc.explain_oom(RaisingSize(3 * MiB, 0))
        assert (e.op, e.requested) == ("cupy", 3 * MiB), "the size read from the text"
        e = cc.explain_oom(without_size("Out of memory allocating 1,048,576 bytes"))
        assert (e.op, e.requested) == ("cupy", MiB)


def test_explain_oom_without_a_shared_pool(dev: cc.Device) -> None:
    e = cc.explain_oom(MemoryError("std::bad_alloc: out_of_memory: CUDA error (failed to allocate 1099511627776 bytes) at: x"))
    assert (e.cause, e.op, e.requested, e.device) == ("too_large", "rmm", 1 << 40, 0)
    assert e.by_library == {}


def test_an_error_while_the_split_is_read_leaves_the_split_out(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split's statistics failing with an out-of-memory error of their own do not recurse: that error
    gets no split, and the error being made keeps its verdict without one."""
    real = _explain.core
    calls: list[int] = []

    class Failing:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def MemoryStats(self, ordinal: int) -> str:
            calls.append(ordinal)
            raise _errors.error("CUDA_ERROR_OUT_OF_MEMORY", "the statistics ran out of memory", device=ordinal)

    with cc.share_pool(dev, libraries=[]):
        monkeypatch.setattr(_explain, "core", Failing())
        with pytest.raises(cc.OutOfMemoryError) as e:
            dev.allocate(1 << 50)
        monkeypatch.setattr(_explain, "core", real)
    assert calls == [0]
    assert e.value.cause == "too_large" and e.value.by_library == {}

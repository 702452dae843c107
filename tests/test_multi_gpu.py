"""Several GPUs and several processes on the real driver.

The cross-process checks of tests/test_multi.py run here with ``CUDACORE_BACKEND=cuda`` (one GPU is
enough: IPC between two processes on one device). Peer access, peer copies and the NCCL all_reduce need two
GPUs and skip otherwise. Every process started here keeps NVLink multicast off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cudacore as cc
from test_ipc_leases import check_an_exporter_that_exited_is_refused
from test_multi import (
    ALLOCATORS,
    check_collected_shared_buffer_stays_valid_while_held,
    check_event_shared_between_processes,
    check_exporter_cannot_free_what_an_importer_holds,
    check_handle_of_an_exited_exporter_is_refused,
    check_importer_that_exits_without_closing_releases_its_hold,
    check_kind_chosen_per_buffer,
    check_shared_buffer_into_spawn_workers,
)

from conftest import ROOT, run_python

pytestmark = pytest.mark.gpu

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def two_gpus() -> tuple[cc.Device, cc.Device]:
    if cc.backend() != "cuda" or cc.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    return cc.Device(0), cc.Device(1)


# -- several processes, one GPU is enough ------------------------------------------------------------------------


def _machine_kind(kind: str) -> str:
    """The kind allocate_shareable gives here where ``kind`` is expected: "ipc" instead of "pool" on a
    driver that refuses to export pool blocks (the H100 test machine does; docs/guide/multi-gpu.md)."""
    if kind == "pool" and cc.Device(0).allocation_strategy == "pool":
        return str(cc._api.call(cc._api.core.ShareKind, 0))
    return kind


@pytest.mark.parametrize(("allocator", "kind"), ALLOCATORS)
def test_shared_buffer_into_spawn_workers_gpu(allocator: str, kind: str) -> None:
    check_shared_buffer_into_spawn_workers(allocator, _machine_kind(kind), backend="cuda")


@pytest.mark.parametrize("allocator", ["pool", "sync"])
def test_exporter_cannot_free_what_an_importer_holds_gpu(allocator: str) -> None:
    check_exporter_cannot_free_what_an_importer_holds(allocator, backend="cuda")


def test_kind_chosen_per_buffer_gpu() -> None:
    check_kind_chosen_per_buffer(backend="cuda")


def test_cupy_opens_an_ipc_kind_handle() -> None:
    """kind="ipc" memory carries a real cuIpcMemHandle: CuPy opens it in another process without cudacore."""
    pytest.importorskip("cupy")
    code = textwrap.dedent(
        """
        import multiprocessing as mp

        def child(raw, q):
            import cupy
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(raw)
            mem = cupy.cuda.UnownedMemory(ptr, 16, None)
            arr = cupy.ndarray((16,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0))
            q.put(bytes(arr.get().tobytes()))
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)

        if __name__ == "__main__":
            import cudacore as cc
            sb = cc.Device(0).allocate_shareable(16, kind="ipc")
            sb.copy_from(bytes(range(16)))
            with sb.export() as h:
                raw = bytes.fromhex(h.handle)
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(raw, q)); p.start()
            print(q.get(timeout=120) == bytes(range(16))); p.join()
            sb.close()
        """
    )
    r = run_python(code, env={"CUDACORE_BACKEND": "cuda", **NO_MULTICAST}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "True"


def test_handle_of_an_exited_exporter_is_refused_gpu() -> None:
    check_handle_of_an_exited_exporter_is_refused(backend="cuda")


@pytest.mark.parametrize("how", ["pidfd", "no-pidfd"])
def test_an_exporter_that_exited_is_refused_where_its_lease_is_mapped_gpu(how: str) -> None:
    check_an_exporter_that_exited_is_refused(how, backend="cuda")


def test_importer_that_exits_without_closing_releases_its_hold_gpu() -> None:
    check_importer_that_exits_without_closing_releases_its_hold(backend="cuda")


def test_collected_shared_buffer_stays_valid_while_held_gpu() -> None:
    check_collected_shared_buffer_stays_valid_while_held(backend="cuda")


def test_event_shared_between_processes_gpu() -> None:
    check_event_shared_between_processes(backend="cuda")


def test_numba_ipc_handle_opens_with_numba_alone() -> None:
    """The Numba plug-in's get_ipc_handle: a Numba array allocated through cudacore (sync strategy) is
    opened in a spawned process by Numba's own IpcArrayHandle.open."""
    pytest.importorskip("numba.cuda")
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        import numpy as np

        def child(h, q):
            from numba import cuda
            arr = h.open()
            q.put(arr.copy_to_host().tolist())
            h.close()

        if __name__ == "__main__":
            from numba import cuda
            a = cuda.to_device(np.arange(16, dtype=np.int32))
            h = a.get_ipc_handle()
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(h, q)); p.start()
            print(q.get(timeout=120)); p.join(); print(p.exitcode)
        """
    )
    env = {"CUDACORE_BACKEND": "cuda", "CUDACORE_ALLOCATOR": "sync", "NUMBA_CUDA_MEMORY_MANAGER": "cudacore.interop", **NO_MULTICAST}
    r = run_python(code, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [str(list(range(16))), "0"]


def test_numba_ipc_refused_on_pool_memory_with_the_fix() -> None:
    pytest.importorskip("numba.cuda")
    code = textwrap.dedent(
        """
        import numpy as np
        from numba import cuda
        import cudacore as cc
        a = cuda.to_device(np.arange(4))
        try:
            a.get_ipc_handle()
        except cc.NotSupportedError as e:
            print("CUDACORE_ALLOCATOR=sync" in str(e))
        """
    )
    env = {"CUDACORE_BACKEND": "cuda", "CUDACORE_ALLOCATOR": "pool", "NUMBA_CUDA_MEMORY_MANAGER": "cudacore.interop"}
    r = run_python(code, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "True"


# -- two GPUs -------------------------------------------------------------------------------------------------------


def test_peer_matrix_matches_the_driver() -> None:
    d0, d1 = two_gpus()
    bindings = pytest.importorskip("cuda.bindings.driver")
    err, can = bindings.cuDeviceCanAccessPeer(0, 1)
    assert int(err) == 0
    assert d0.can_access_peer(d1) == bool(can)
    assert d0.can_access_peer(d0) is False


def test_links_match_the_driver_and_nvml() -> None:
    """doctor's link report agrees with cuDeviceGetP2PAttribute (through cuda.bindings) and, where NVML is
    there (nvidia-ml-py), with NVML's NVLink count between the two GPUs. -s prints it."""
    two_gpus()
    from cudacore._topology import describe_link, link

    bindings = pytest.importorskip("cuda.bindings.driver")
    got = link(0, 1)
    print("link 0 -> 1:", got, "|", describe_link(got))
    attrs = bindings.CUdevice_P2PAttribute
    for key, attr in (
        ("access", attrs.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED),
        ("native_atomics", attrs.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED),
        ("performance_rank", attrs.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
    ):
        err, value = bindings.cuDeviceGetP2PAttribute(attr, 0, 1)
        assert int(err) == 0
        assert got[key] == (value if key == "performance_rank" else bool(value)), key
    try:
        import pynvml
    except ImportError:
        return
    if got["nvml"] != "ok":
        pytest.fail(f"nvidia-ml-py is installed but cudacore found no NVML: {got['nvml']}")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByPciBusId(cc.Device(0).pci_bus_id)
    status = pynvml.nvmlDeviceGetP2PStatus(handle, pynvml.nvmlDeviceGetHandleByPciBusId(cc.Device(1).pci_bus_id), pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    assert (got["kind"] == "nvlink") == (status == pynvml.NVML_P2P_STATUS_OK)
    if got["kind"] == "nvlink":
        active = 0
        for n in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active += pynvml.nvmlDeviceGetNvLinkState(handle, n) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError:
                pass
        assert got["nvlinks"] == active, "every active link of device 0 ends at device 1 or at an NVSwitch"


@pytest.mark.parametrize("capturing", [0, 1])
def test_link_probe_leaves_a_global_capture_on_either_device(capturing: int) -> None:
    """The link probe (cuDeviceGetP2PAttribute, cuDeviceGetPCIBusId, NVML) during a GLOBAL capture on
    either GPU: the capture is not invalidated (docs/contributing/driver-facts.md, "Links between devices")."""
    two_gpus()
    from cudacore._topology import link

    s = cc.Device(capturing).create_stream()
    try:
        s.begin_capture("global")
        link(0, 1)
        link(1, 0)
        s.end_capture().destroy()  # a CaptureError here: the probe invalidated the capture
    finally:
        s.close()


@pytest.mark.parametrize("n", [1, 4096, 64 << 20])
def test_peer_copies_both_ways(n: int) -> None:
    d0, d1 = two_gpus()
    if d0.can_access_peer(d1):
        d0.enable_peer_access(d1)
        d1.enable_peer_access(d0)
        d0.enable_peer_access(d1)  # idempotent
    data = bytes(i % 253 for i in range(n))
    a, b = d0.allocate(n), d1.allocate(n)
    a.copy_from(data)
    cc.device_to_device(b, a)  # synchronous
    out = bytearray(n)
    b.copy_to(out)
    assert out == data
    s0, s1 = d0.create_stream(), d1.create_stream()
    b.copy_from(b"\x11" * n, stream=s1)
    ev = cc.Event(d1, timing=False).record(s1)
    s0.wait_event(ev)  # device 0's stream waits for device 1's write
    cc.device_to_device(a, b, s0)  # on the destination's stream
    s0.synchronize()
    a.copy_to(out)
    assert out == b"\x11" * n
    cc.device_to_device(b, a, s0, nbytes=n // 2)  # on the source's stream
    s0.synchronize()
    for buf in (a, b):
        buf.close()
    s0.close()
    s1.close()


@pytest.mark.parametrize("shareable", [False, True])
def test_kernel_writes_peer_pool_memory_after_enable_peer_access(shareable: bool) -> None:
    """enable_peer_access covers the peer's pools (cuMemPoolSetAccess): a kernel on device 0 writes a
    buffer of device 1's allocator pool, and of its exportable pool."""
    import struct

    d0, d1 = two_gpus()
    if not d0.can_access_peer(d1):
        pytest.skip("the two GPUs have no peer access")
    if d1.allocation_strategy != "pool":
        pytest.skip("device 1 does not use the pool strategy")
    d0.enable_peer_access(d1)
    module = d0.load_module(ROOT / "tests" / "kernels" / "fill.ptx")
    buf = d1.allocate_shareable(4096) if shareable else d1.allocate(4096)
    buf.copy_from(bytes(4096))
    s = d0.create_stream()
    module.function("fill").launch(grid=4, block=256, args=(buf, 9, 1024), stream=s)
    s.synchronize()
    out = bytearray(4096)
    buf.copy_to(out)
    assert out == struct.pack("<I", 9) * 1024
    buf.close()
    s.close()


def test_peer_copy_from_threads_without_context() -> None:
    d0, d1 = two_gpus()
    import threading

    errors: list[str] = []

    def work() -> None:
        try:
            a, b = d0.allocate(1 << 20), d1.allocate(1 << 20)
            a.copy_from(b"\x05" * (1 << 20))
            s = d1.create_stream()
            cc.device_to_device(b, a, s)
            s.synchronize()
            out = bytearray(1 << 20)
            b.copy_to(out)
            assert out == b"\x05" * (1 << 20)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_allreduce_example() -> None:
    two_gpus()
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "allreduce.py")],
        env={**os.environ, "CUDACORE_BACKEND": "cuda", **NO_MULTICAST},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all_reduce OK" in r.stdout
    assert "rank 0: torch.distributed all_reduce -> [3.0]" in r.stdout


@pytest.mark.parametrize(
    ("extra", "path"),
    [({}, "copy"), ({"CUDACORE_ALLOCATOR": "sync", "NCCL_LEGACY_CUDA_REGISTER": "1"}, "legacy_ipc")],
    ids=["pool", "sync-legacy-register"],
)
def test_torchrun_allreduce_example(extra: dict[str, str], path: str) -> None:
    """examples/torchrun_allreduce.py under torchrun on 2 GPUs: the pool's memory is cudacore's, the
    all_reduce and all_gather results are right, and the path is the one nccl_memory_path predicts; where it
    registers, NCCL's own log (NCCL_DEBUG_SUBSYS=REG) shows the IPC registration of the all_gather's output.
    -s prints the bandwidths."""
    two_gpus()
    pytest.importorskip("torch")
    env = {**os.environ, "CUDACORE_BACKEND": "cuda", **NO_MULTICAST, **extra, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "REG"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(ROOT / "examples" / "torchrun_allreduce.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = r.stdout + r.stderr
    print(out)
    assert r.returncode == 0, out
    assert "memory from cudacore; results right on every rank" in out
    assert f"path '{path}'" in out
    assert ("registered with NCCL" in out) == (path != "copy")
    assert "all_reduce ratio " in out and "all_gather ratio " in out
    if path != "copy" and "NCCL INFO" in out:
        # NCCL's own word (its REG log): the all_gather's output, a pool tensor, was registered with the peer.
        assert " - IPC register" in out or " - IPC reuse" in out, "NCCL logged no IPC registration of the pool's buffers"


def test_bench_runs_on_two_gpus() -> None:
    two_gpus()
    r = subprocess.run(
        [sys.executable, str(Path(ROOT) / "bench" / "multi_gpu.py"), "--rounds", "1"],
        env={**os.environ, "CUDACORE_BACKEND": "cuda", **NO_MULTICAST},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "peer copy   64 MiB  cudacore" in r.stdout
    assert "all_reduce  256 MiB  cudacore pool (" in r.stdout

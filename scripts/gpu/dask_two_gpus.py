"""cudacore.dask on two GPUs: the Dask part of issue 33's targets, in one run (docs/contributing/gpu-testing.md,
"Dask on two GPUs").

    python3 scripts/gpu/dask_two_gpus.py [--n 4096] [--chunk 1024]

Starts a dask_cuda.LocalCUDACluster of 2 workers (one per GPU, over TCP), registers
cudacore.dask.CudacorePlugin, and checks:

- the plugin made cudacore CuPy's allocator on both workers, and the workers are on different GPUs;
- a dask.array of CuPy chunks spread over both GPUs: a reduction (the sum, and the sums of the columns)
  and a matrix product (``a @ a.T``) equal numpy's, with the workload's device memory from cudacore:
  CuPy's own pool holds none, cudacore's peak is above zero on both workers, and the chunks a worker
  receives over TCP (which distributed puts in Numba device arrays, or RMM buffers where RMM is installed)
  are Numba's through cudacore's memory manager (``NUMBA_CUDA_MEMORY_MANAGER=cudacore.interop``, set
  here for the workers), with no RMM on the workers;
- a cudacore Buffer made on one worker arrives on the other worker's GPU with the same bytes;
- ``memory_report(client)`` shows both workers;
- an out of memory provoked on one worker (two CuPy arrays of 60% of its free memory each) reaches the
  client as cudacore.OutOfMemoryError with its verdict; the worker has let go of what the task held
  (``in_use`` back where it was) and computes again; the other worker's device saw no out of memory;
- unregistering the plugin puts CuPy's own allocator back on both workers.

It prints PASS or FAIL for each, the versions, the report, and exits 1 if any failed. NVLink multicast is
kept off in every process it starts (the variables below, set before the cluster starts).

Packages the GPU image lacks travel as wheels (docs/contributing/gpu-testing.md): dask and distributed
2026.7.1 (the versions dask-cuda 26.10 asks for), dask-cuda 26.10.0, partd, locket, tblib, tornado, zict;
RMM is not needed (cudacore leaves it alone).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_name] = _value
# Over TCP, distributed receives a CuPy chunk into a Numba device array (RMM's DeviceBuffer where RMM is
# installed): Numba allocates from cudacore too, through its memory-manager plug-in, which the workers
# inherit from this environment.
os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "cudacore.interop")

import numpy as np

RESULTS: list[tuple[str, bool, str]] = []


def target(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, bool(ok), detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)


# -- what runs on the workers ------------------------------------------------------------------------------


def worker_gpu() -> dict[str, Any]:
    import cudacore as cc

    d = cc.Device(0)
    return {"uuid": d.uuid, "name": d.name, "pci": d.pci_bus_id, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def cupy_state() -> dict[str, Any]:
    """CuPy's allocator on this worker, and what its own pool holds."""
    import cupy

    alloc = cupy.cuda.get_allocator()
    pool = cupy.get_default_memory_pool()
    return {"allocator": getattr(alloc, "__qualname__", repr(alloc)), "pool_total": pool.total_bytes(), "pool_used": pool.used_bytes()}


def receive_path() -> dict[str, Any]:
    """Who allocates the device memory a CuPy chunk arrives in over TCP on this worker."""
    import importlib.util

    out: dict[str, Any] = {"rmm": importlib.util.find_spec("rmm") is not None, "numba_manager": None}
    try:
        from numba import cuda

        mm = getattr(cuda.current_context(), "memory_manager", None)
        out["numba_manager"] = None if mm is None else f"{type(mm).__module__}.{type(mm).__qualname__}"
    except Exception as e:  # noqa: BLE001 - reported
        out["numba_manager"] = f"{type(e).__name__}: {e}"
    return out


def stats() -> dict[str, int]:
    import cudacore as cc

    s = cc.Device(0).memory_stats()
    return {k: int(s[k]) for k in ("in_use", "peak_in_use", "allocations", "ooms")}


def upload(data: np.ndarray) -> Any:
    import cudacore as cc

    buf = cc.Device(0).allocate(data.nbytes)
    buf.copy_from(data)
    return buf


def download(buf: Any) -> dict[str, Any]:
    import cudacore as cc

    out = np.empty(buf.size, np.uint8)
    buf.copy_to(out)
    return {"is_buffer": isinstance(buf, cc.Buffer), "uuid": cc.Device(buf.device_id).uuid, "bytes": out.tobytes()}


def exhaust() -> int:
    """Two CuPy arrays of 60% of the device's free memory each: the second cannot fit."""
    import cupy

    import cudacore as cc

    free, _ = cc.Device(0).memory_info()
    n = int(free * 0.6)
    first = cupy.empty(n, dtype=cupy.uint8)
    second = cupy.empty(n, dtype=cupy.uint8)
    return int(first.size + second.size)


def small_sum() -> float:
    import cupy

    return float(cupy.arange(1_000_000, dtype=cupy.float64).sum())


# -- the run -------------------------------------------------------------------------------------------------


def settled(client: Any) -> dict[str, dict[str, int]]:
    """Every worker's statistics once two readings 0.2 s apart agree (the releases of finished tasks'
    intermediates reach the workers after the results reach the client)."""
    last = client.run(stats)
    for _ in range(50):
        time.sleep(0.2)
        now = client.run(stats)
        if now == last:
            return now
        last = now
    return last



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="the matrix is n x n float64")
    ap.add_argument("--chunk", type=int, default=1024, help="chunks are chunk x chunk")
    args = ap.parse_args()

    import cupy
    import dask
    import dask.array as da
    import dask_cuda
    import distributed
    from distributed import Client

    import cudacore
    import cudacore.dask as cdask

    print(
        f"cudacore {cudacore.__version__}, dask {dask.__version__}, distributed {distributed.__version__}, "
        f"dask-cuda {dask_cuda.__version__}, cupy {cupy.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}",
        flush=True,
    )
    t0 = time.perf_counter()
    with dask_cuda.LocalCUDACluster(
        n_workers=2, CUDA_VISIBLE_DEVICES="0,1", threads_per_worker=2, protocol="tcp", dashboard_address=None
    ) as cluster, Client(cluster) as client:
        print(f"cluster up in {time.perf_counter() - t0:.1f} s", flush=True)
        w0, w1 = sorted(client.scheduler_info()["workers"])
        client.register_plugin(cdask.CudacorePlugin())
        libs = client.run(lambda dask_worker: dask_worker.plugins[cdask.PLUGIN_NAME].libraries)
        print("plugin:", libs, flush=True)
        cupy_before = client.run(cupy_state)
        target(
            "plugin: cudacore is CuPy's allocator on both workers",
            all("cupy_allocator" in s["allocator"] for s in cupy_before.values()) and len(cupy_before) == 2,
            str({w: s["allocator"] for w, s in cupy_before.items()}),
        )
        gpus = client.run(worker_gpu)
        target("one worker per GPU", gpus[w0]["uuid"] != gpus[w1]["uuid"], str(gpus))

        # A dask.array of CuPy chunks over both GPUs.
        rng = np.random.default_rng(0)
        a_np = rng.standard_normal((args.n, args.n))
        a = da.from_array(a_np, chunks=(args.chunk, args.chunk)).map_blocks(cupy.asarray)
        a = a.persist()
        distributed.wait(a)
        holders = {w for keys in client.who_has(a).values() for w in keys}
        target("the chunks live on both workers", holders == {w0, w1}, f"held by {sorted(holders)}")

        def to_host(x: Any) -> Any:
            return x.map_blocks(cupy.asnumpy, dtype=x.dtype, meta=np.empty((0,) * x.ndim, x.dtype))

        t = time.perf_counter()
        total, cols = dask.compute(to_host(a.sum()), to_host(a.sum(axis=0)))
        red_s = time.perf_counter() - t
        want_total, want_cols = a_np.sum(), a_np.sum(axis=0)
        target(
            "reduction equals numpy (sum and column sums)",
            bool(np.isclose(total, want_total, rtol=1e-9, atol=1e-6) and np.allclose(cols, want_cols, rtol=1e-9, atol=1e-9)),
            f"sum {float(total):.9g} vs {float(want_total):.9g}, {red_s:.2f} s",
        )
        t = time.perf_counter()
        prod = to_host(a @ a.T).compute()
        mm_s = time.perf_counter() - t
        want = a_np @ a_np.T
        err = float(np.max(np.abs(prod - want)) / np.max(np.abs(want)))
        target("matrix product equals numpy", err < 1e-10, f"max relative error {err:.2e}, {mm_s:.2f} s")

        st = client.run(stats)
        cp_after = client.run(cupy_state)
        received = client.run(receive_path)
        target(
            "all device memory of the workload came from cudacore",
            all(s["peak_in_use"] > 0 and s["allocations"] > 0 for s in st.values())
            and all(c["pool_total"] == 0 for c in cp_after.values())
            and all(not r["rmm"] and str(r["numba_manager"]).startswith("cudacore.interop.")
                    and str(r["numba_manager"]).endswith(".NumbaMemoryManager") for r in received.values()),
            f"cudacore peak {[st[w]['peak_in_use'] for w in (w0, w1)]}, CuPy's own pool {[cp_after[w]['pool_total'] for w in (w0, w1)]}, "
            f"chunks received into {received}",
        )

        # A cudacore Buffer from one GPU's worker to the other's.
        payload = np.frombuffer(rng.bytes(1 << 24), np.uint8)
        buf = client.submit(upload, payload, workers=[w0], pure=False)
        got = client.submit(download, buf, workers=[w1], pure=False).result()
        target(
            "a Buffer moves from one worker's GPU to the other's",
            got["is_buffer"] and got["uuid"] == gpus[w1]["uuid"] and got["bytes"] == payload.tobytes(),
            f"arrived on {got['uuid']}",
        )

        report = cdask.memory_report(client)
        print(report, flush=True)
        target("memory_report shows both workers", sorted(report) == [w0, w1] and all(r.stats is not None for r in report.values()))

        # An out of memory on worker 0 (what the workers hold stays: the chunks, the Buffer).
        base = settled(client)
        try:
            client.submit(exhaust, workers=[w0], pure=False).result()
            target("an out of memory on one worker arrives typed, with its verdict", False, "the task did not run out")
        except cudacore.OutOfMemoryError as e:
            target(
                "an out of memory on one worker arrives typed, with its verdict",
                e.cause is not None and e.device == 0 and e.requested > 0,
                f"cause {e.cause}, requested {e.requested}, free {e.free}, in use {e.in_use}: {str(e)[:160]}",
            )
        except Exception as e:  # noqa: BLE001 - reported as the failure it is
            target("an out of memory on one worker arrives typed, with its verdict", False, f"{type(e).__name__}: {e}")
        after = settled(client)
        again = client.submit(small_sum, workers=[w0], pure=False).result()
        target(
            "the worker let go of the failed task's memory and keeps working",
            # No more in use than before (less is the cluster releasing what it held meanwhile: the
            # Buffer's copy on this worker once the other worker has its own).
            after[w0]["in_use"] <= base[w0]["in_use"] and again == float(sum(range(1_000_000))),
            f"in use {base[w0]['in_use']} before, {after[w0]['in_use']} after",
        )
        target("the other worker's device saw no out of memory", after[w1]["ooms"] == base[w1]["ooms"] == 0)
        print(cdask.memory_report(client, events=5), flush=True)

        client.unregister_worker_plugin(cdask.PLUGIN_NAME)
        cp_end = client.run(cupy_state)
        target(
            "unregistering puts CuPy's allocator back",
            all("cupy_allocator" not in c["allocator"] for c in cp_end.values()),
            str({w: c["allocator"] for w, c in cp_end.items()}),
        )
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

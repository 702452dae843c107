"""cudacore.dask on a LocalCluster of simulated devices, run by tests/test_dask.py in a fresh interpreter.

``python tests/dask_workload.py processes|threads CUPY_STAND_IN_DIR`` starts distributed's own LocalCluster
(2 workers; with ``processes`` each worker is a process whose environment selects the simulator and one
simulated device of 256 MiB; with ``threads`` both workers run in this process, which must select them
itself, and talk over TCP so that data between them is serialized), registers :class:`CudacorePlugin`, and
records what happened as one JSON object on the last line of standard output; the test asserts on it.

Kernels do not run on the simulator, so the computation is copies: each worker uploads numpy chunks into
Buffers, each Buffer is fetched by the other worker (Dask's serializers carry it), downloaded there and
compared with numpy. CuPy is a stand-in on the workers' path (``CUPY_STAND_IN_DIR``: its allocator API
only), so that the plugin's installing and restoring of CuPy's allocator is checked without a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

import cudacore as cc
import cudacore.dask as cdask

MIB = 1 << 20
SIM_DEVICES = json.dumps([{"name": "sim-worker", "total_memory": 256 * MIB}])


def upload(chunk: np.ndarray) -> cc.Buffer:
    """A Buffer on the worker's device holding ``chunk``'s bytes."""
    buf = cc.Device(0).allocate(chunk.nbytes)
    buf.copy_from(chunk)
    return buf


def where(buf: cc.Buffer) -> dict[str, Any]:
    return {"pid": os.getpid(), "ptr": buf.ptr}


def download(buf: Any, sent_from: dict[str, Any]) -> dict[str, Any]:
    """On the receiving worker: what arrived, and its bytes as float64."""
    out = np.empty(buf.size // 8, np.float64)
    buf.copy_to(out)
    return {
        "type": type(buf).__name__,
        "is_buffer": isinstance(buf, cc.Buffer),
        "device": buf.device_id,
        "size": buf.size,
        "pid": os.getpid(),
        "other_process": os.getpid() != sent_from["pid"],
        "new_memory": buf.ptr != sent_from["ptr"] or os.getpid() != sent_from["pid"],
        "values": out.tolist(),
    }


def run_out_of_memory() -> None:
    """Hold 192 MiB of the 256 MiB device in locals, then ask for 128 MiB more."""
    d = cc.Device(0)
    held = d.allocate(128 * MIB)
    more = d.allocate(64 * MIB)
    d.allocate(128 * MIB)
    del held, more  # not reached


def in_use() -> int:
    return int(cc.Device(0).memory_stats()["in_use"])


def cupy_state() -> dict[str, Any]:
    """The stand-in CuPy's allocator on this worker, and an allocation through it."""
    import cupy

    alloc = cupy.cuda.get_allocator()
    before = in_use()
    ptr = cupy.cuda.alloc(3 * MIB)
    during = in_use()
    owner = type(ptr.mem.owner).__name__ if ptr.mem.owner is not None else None
    del ptr
    return {"allocator": getattr(alloc, "__qualname__", repr(alloc)), "grew": during - before, "owner": owner, "after": in_use() - before}


def main() -> None:
    from distributed import Client, LocalCluster

    processes = sys.argv[1] == "processes"
    stand_in = sys.argv[2]
    t0 = time.perf_counter()
    facts: dict[str, Any] = {}
    if processes:
        # Each worker process is told to run on the simulator, with one small simulated device.
        env = {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": SIM_DEVICES, "PYTHONPATH": stand_in + os.pathsep + os.environ.get("PYTHONPATH", "")}
        kwargs: dict[str, Any] = {"processes": True, "env": env}
    else:
        kwargs = {"processes": False, "protocol": "tcp"}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, **kwargs) as cluster, Client(cluster) as client:
        facts["start_s"] = time.perf_counter() - t0
        a, b = sorted(client.scheduler_info()["workers"])
        facts["workers"] = [a, b]
        facts["backends"] = sorted(set(client.run(cc.backend).values()))

        # A device the workers do not have: the registration fails, typed, at the client.
        try:
            client.register_plugin(cdask.CudacorePlugin(device=5))
            facts["bad_device"] = "registered"
        except cc.CUDAError as e:
            facts["bad_device"] = type(e).__name__
        facts["register"] = client.register_plugin(cdask.CudacorePlugin())
        facts["libraries"] = client.run(lambda dask_worker: dask_worker.plugins[cdask.PLUGIN_NAME].libraries)
        facts["cupy"] = client.run(cupy_state)

        # Chunks uploaded on one worker, fetched by the other through the serializers, downloaded there.
        x = np.arange(4096, dtype=np.float64) * 0.5
        chunks = np.array_split(x, 4)
        homes = [a, b, a, b]
        bufs = [client.submit(upload, c, workers=[w], pure=False) for c, w in zip(chunks, homes, strict=True)]
        sent = [client.submit(where, f, workers=[w], pure=False) for f, w in zip(bufs, homes, strict=True)]
        got = client.gather(
            [client.submit(download, f, s, workers=[b if w == a else a], pure=False) for f, s, w in zip(bufs, sent, homes, strict=True)]
        )
        facts["arrived"] = [{k: v for k, v in g.items() if k != "values"} for g in got]
        y = np.concatenate([np.array(g["values"]) for g in got])
        facts["equal"] = bool(np.array_equal(y, x))
        facts["sum_equal"] = float(y.sum()) == float(x.sum())

        report = cdask.memory_report(client)
        facts["report_workers"] = sorted(report)
        facts["report_text"] = str(report)
        facts["report_html"] = report._repr_html_()

        # An out of memory on worker a: typed at the client, with the worker's verdict.
        base = client.run(in_use, workers=[a])[a]
        try:
            client.submit(run_out_of_memory, workers=[a], pure=False).result()
            facts["oom"] = None
        except cc.OutOfMemoryError as e:
            facts["oom"] = {
                "type": type(e).__name__,
                "cause": e.cause,
                "requested": e.requested,
                "device": e.device,
                "in_use": e.in_use,
                "total": e.total,
                "message": str(e),
                "last_event": e.flight_record[-1]["kind"] if e.flight_record else None,
            }
        except Exception as e:  # noqa: BLE001 - recorded for the test to report
            facts["oom"] = {"type": type(e).__name__, "message": str(e)}
        facts["in_use_before_oom"] = base
        facts["in_use_after_oom"] = client.run(in_use, workers=[a])[a]
        after = cdask.memory_report(client)
        facts["ooms_reported"] = {w: [e["note"] for e in after[w].ooms] for w in after}
        facts["report_after_text"] = str(after)

        # The worker goes on: another chunk through it, both ways.
        again = client.submit(upload, x, workers=[a], pure=False)
        back = client.submit(download, again, client.submit(where, again, workers=[a], pure=False), workers=[b], pure=False)
        facts["after_oom_equal"] = np.array_equal(np.array(back.result()["values"]), x)

        del bufs, sent, again, back
        client.unregister_worker_plugin(cdask.PLUGIN_NAME)
        facts["cupy_after_unregister"] = client.run(cupy_state)
        facts["plugins_after_unregister"] = client.run(lambda dask_worker: sorted(dask_worker.plugins))
    facts["total_s"] = time.perf_counter() - t0
    print(json.dumps(facts, default=str))


if __name__ == "__main__":
    main()

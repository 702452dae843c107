"""cudacore buffers in NCCL collectives: an all_reduce across 2 GPUs in 2 processes, without copies.

Each process allocates a :class:`cudacore.Buffer` on its own GPU, views it as a float32 tensor through
DLPack (``torch.from_dlpack``: the same memory), and all-reduces it with ``torch.distributed`` over NCCL;
then does the same through CuPy's NCCL bindings (``cupy.cuda.nccl``) on the buffer's address, where CuPy
has them. Afterwards every element holds 1 + 2 = 3 on both GPUs, read back through cudacore.

    python examples/allreduce.py                 # needs 2 GPUs, torch (and CuPy for the second part)

The example leaves NCCL's settings to the environment. On a machine where NVLink multicast must stay off,
set NCCL_NVLS_ENABLE=0 (and TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) before running it,
as the project's own GPU runs do (docs/contributing/gpu-testing.md).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import socket
import sys
from typing import Any

N = 1 << 20  # float32 elements


def with_torch(rank: int, port: int) -> list[float]:
    import torch
    import torch.distributed as dist

    import cudacore as cc

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = cc.Device(rank).allocate(4 * N)
    try:
        x = torch.from_dlpack(buf).view(torch.float32)  # no copy: x.data_ptr() == buf.ptr
        assert x.data_ptr() == buf.ptr
        x.fill_(rank + 1.0)
        dist.all_reduce(x)  # sum over the two processes, in the Buffer's memory
        torch.cuda.synchronize()
        got = _read_floats(buf)
        del x
    finally:
        dist.destroy_process_group()
    # The Buffer refuses to close while a DLPack consumer still holds it; NCCL's bookkeeping may keep the
    # tensor until its process group is gone, hence the close comes last.
    gc.collect()
    buf.close()
    return got


def with_cupy(rank: int, uid_queue: Any) -> list[float] | None:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError:
        return None
    import cudacore as cc

    with cupy.cuda.Device(rank):
        uid = nccl.get_unique_id() if rank == 0 else None
        if rank == 0:
            uid_queue.put(uid)
        else:
            uid = uid_queue.get(timeout=60)
        comm = nccl.NcclCommunicator(2, uid, rank)
        dev = cc.Device(rank)
        buf = dev.allocate(4 * N)
        cupy.from_dlpack(buf).view(cupy.float32).fill(rank + 1.0)  # the same memory, through DLPack
        cupy.cuda.get_current_stream().synchronize()  # CuPy's fill before NCCL's stream reads the buffer
        stream = dev.create_stream()
        # NCCL in place on the Buffer's address, ordered on a cudacore stream.
        comm.allReduce(buf.ptr, buf.ptr, N, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.handle)
        stream.synchronize()
        got = _read_floats(buf)
        buf.close()
        stream.close()
        return got


def _read_floats(buf: Any) -> list[float]:
    import struct

    host = bytearray(buf.size)
    buf.copy_to(host)
    return sorted(set(struct.unpack(f"<{N}f", bytes(host))))


def worker(rank: int, port: int, uid_queue: Any, out: Any) -> None:
    out.put((rank, with_torch(rank, port), with_cupy(rank, uid_queue)))


def main() -> int:
    import cudacore as cc

    if cc.backend() != "cuda" or cc.device_count() < 2:
        print("this example needs 2 GPUs (the CUDA backend)")
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    uid_queue, out = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, port, uid_queue, out)) for rank in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    ok = True
    for rank, torch_values, cupy_values in results:
        print(f"rank {rank}: torch.distributed all_reduce -> {torch_values}", end="")
        print("" if cupy_values is None else f"; CuPy NCCL allReduce -> {cupy_values}")
        ok &= torch_values == [3.0] and cupy_values in (None, [3.0])
    ok &= all(p.exitcode == 0 for p in procs)
    print("all_reduce OK" if ok else "all_reduce FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

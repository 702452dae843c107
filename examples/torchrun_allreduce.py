"""all_reduce on cudacore's memory under torchrun, registered with NCCL where NCCL can take it.

Every rank makes a ``torch.cuda.MemPool`` whose memory comes from cudacore
(:func:`cudacore.interop.nccl_mem_pool`), registers it with the process group's NCCL communicator where
NCCL can use it without a copy (:func:`cudacore.interop.register_nccl_pool`, which says which path it took),
all-reduces a tensor from that pool and checks the sums, then times the all_reduce of 256 MiB against the
same all_reduce of a tensor on PyTorch's own allocator and prints both bus bandwidths and their ratio
(issue 33's target: at least 0.95).

    torchrun --nproc-per-node 2 examples/torchrun_allreduce.py
    CUDACORE_ALLOCATOR=sync NCCL_LEGACY_CUDA_REGISTER=1 torchrun --nproc-per-node 2 examples/torchrun_allreduce.py

The second line gives cudacore's memory a kind NCCL registers (cuMemAlloc memory through cuIpc handles);
with the default pool strategy NCCL stages through its own buffers, and the example says so. Across hosts,
the same script runs under torchrun with a rendezvous (docs/guide/multi-gpu.md). NCCL's settings come from
the environment: the example sets none (on a machine where NVLink multicast must stay off, export
NCCL_NVLS_ENABLE=0 before running it). The exit status is 1 when a sum is wrong.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

SIZE = 256 << 20  # bytes all-reduced in the timed rounds
ROUNDS = 7  # interleaved rounds; each times REPS all_reduces of each contender
REPS = 20


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """GB/s on the bus for an all_reduce of nbytes taking seconds, as nccl-tests reports it."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def main() -> int:
    import torch
    import torch.distributed as dist

    import cudacore as cc
    from cudacore import interop

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    # device_id makes the NCCL communicator now: registering a pool needs it.
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = cc.Device(local)
    reg = interop.register_nccl_pool(interop.nccl_mem_pool(dev))
    n = SIZE // 4
    before = dev.memory_stats()["in_use"]
    with torch.cuda.use_mem_pool(reg.pool):
        ours = torch.empty(n, dtype=torch.float32, device="cuda")
    from_cudacore = dev.memory_stats()["in_use"] - before >= SIZE
    theirs = torch.empty(n, dtype=torch.float32, device="cuda")

    ok = from_cudacore
    want = world * (world + 1) / 2
    for t in (ours, theirs):
        t.fill_(rank + 1.0)
        dist.all_reduce(t)
        ok &= bool(torch.all(t == want).item())

    def timed(t: torch.Tensor) -> float:
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPS):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / REPS

    samples: dict[str, list[float]] = {"cudacore": [], "torch": []}
    for _ in range(ROUNDS):
        samples["cudacore"].append(timed(ours))
        samples["torch"].append(timed(theirs))
    bus = {name: bus_bandwidth(SIZE, statistics.median(v), world) for name, v in samples.items()}

    oks = [None] * world if rank == 0 else None
    dist.gather_object(ok, oks)
    if rank == 0:
        assert oks is not None
        print(f"{world} ranks; {reg}")
        failed = [r for r, v in enumerate(oks) if not v]
        print(f"FAILED on ranks {failed}: memory not from cudacore, or a wrong sum" if failed else "memory from cudacore; sums right on every rank")
        for name in ("cudacore", "torch"):
            print(f"all_reduce {SIZE >> 20} MiB  {name:<9} {bus[name]:7.1f} GB/s bus bandwidth")
        ratio = bus["cudacore"] / bus["torch"]
        print(f"ratio {ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
    del ours, theirs
    reg.deregister()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""all_reduce on cudacore's memory under torchrun, registered with NCCL where NCCL can take it.

Every rank makes a ``torch.cuda.MemPool`` whose memory comes from cudacore
(:func:`cudacore.interop.nccl_mem_pool`), registers it with the process group's NCCL communicator where
NCCL can use it without a copy (:func:`cudacore.interop.register_nccl_pool`, which says which path it took),
all-reduces a tensor from that pool and all-gathers into one, and checks the results. Then it times, on
256 MiB, the all_reduce (issue 33's target: at least 0.95 of the bus bandwidth on PyTorch's own allocator)
and the all_gather, each against the same collective on tensors of PyTorch's own allocator.

``torch.distributed.all_reduce`` reduces in place, and NCCL registers no buffer of an in-place all_reduce
(ring or tree) on one host: the all_reduce takes NCCL's staged path whatever the memory. The all_gather
writes another tensor, which NCCL does register where it can, so that row shows what registration gives
(docs/contributing/driver-facts.md, "NCCL's user buffers").

    torchrun --nproc-per-node 2 examples/torchrun_allreduce.py
    CUDACORE_ALLOCATOR=sync NCCL_LEGACY_CUDA_REGISTER=1 torchrun --nproc-per-node 2 examples/torchrun_allreduce.py

The second line gives cudacore's memory a kind NCCL registers (cuMemAlloc memory through cuIpc handles);
with the default pool strategy NCCL stages through its own buffers, and the example says so. Across hosts,
the same script runs under torchrun with a rendezvous (docs/guide/multi-gpu.md). NCCL's settings come from
the environment: the example sets none (on a machine where NVLink multicast must stay off, export
NCCL_NVLS_ENABLE=0 before running it). The exit status is 1 when a result is wrong.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

SIZE = 256 << 20  # bytes all-reduced, and all-gathered into, in the timed rounds
ROUNDS = 7  # interleaved rounds; each times REPS calls of each contender
REPS = 20


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
    # all_gather: each rank gives n / world elements, every rank receives all n.
    part = n // world
    with torch.cuda.use_mem_pool(reg.pool):
        ours_in, ours_out = torch.full((part,), rank + 1.0, device="cuda"), torch.empty(part * world, device="cuda")
    theirs_in, theirs_out = torch.full((part,), rank + 1.0, device="cuda"), torch.empty(part * world, device="cuda")
    gathered = torch.arange(1, world + 1, dtype=torch.float32, device="cuda").repeat_interleave(part)
    for src, dst in ((ours_in, ours_out), (theirs_in, theirs_out)):
        dist.all_gather_into_tensor(dst, src)
        ok &= bool(torch.equal(dst, gathered))

    def timed(collective: Callable[[], object]) -> float:
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPS):
            collective()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / REPS

    contenders: dict[str, Callable[[], object]] = {
        "all_reduce cudacore": lambda: dist.all_reduce(ours),
        "all_reduce torch": lambda: dist.all_reduce(theirs),
        "all_gather cudacore": lambda: dist.all_gather_into_tensor(ours_out, ours_in),
        "all_gather torch": lambda: dist.all_gather_into_tensor(theirs_out, theirs_in),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(ROUNDS):  # interleaved: every contender in every round
        for name, collective in contenders.items():
            samples[name].append(timed(collective))
    # Bus bandwidth as nccl-tests reports it: all_reduce moves 2(ranks-1)/ranks of its bytes per rank over
    # the bus, all_gather (ranks-1)/ranks of its output.
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world}
    bus = {name: SIZE / statistics.median(v) * factor[name.split()[0]] / 1e9 for name, v in samples.items()}

    oks = [None] * world if rank == 0 else None
    dist.gather_object(ok, oks)
    if rank == 0:
        assert oks is not None
        print(f"{world} ranks; {reg}")
        failed = [r for r, v in enumerate(oks) if not v]
        print(f"FAILED on ranks {failed}: memory not from cudacore, or a wrong result" if failed else "memory from cudacore; results right on every rank")
        for name, gbs in bus.items():
            print(f"{name:<20} {SIZE >> 20} MiB {gbs:7.1f} GB/s bus bandwidth")
        ratio = bus["all_reduce cudacore"] / bus["all_reduce torch"]
        print(f"all_reduce ratio {ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
        print(f"all_gather ratio {bus['all_gather cudacore'] / bus['all_gather torch']:.3f}")
    reg.deregister()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Does the CUDA driver alone hang under the load that stalls cudacore's parallel fuzzer? Several
processes, each running bursts of short-lived threads that record, wait on, query and synchronize
events and streams while copies and stream creations go on, through raw cuda.bindings (no cudacore).
A process whose threads make no progress for 15 s prints its counters and exits with 3.

    python scripts/gpu/event_threads_repro.py PROCESSES SECONDS [--no-events] [--more=12,...,16] [--no-internal-deps]
        [--no-opportunistic]

--more adds, in a third of the operations, the ones listed: 12 a pinned allocation and its free, 13 a
stream-ordered pool allocation freed on another stream, 14 a short-lived event recorded and destroyed,
15 a pool trim and a memory query, 16 a stream-ordered pool allocation freed on its own stream.
--no-internal-deps and --no-opportunistic turn those reuse policies of the device's default pool off.
--ops=0,3 draws the other operations from these only (0 device copy, 1 synchronous pageable copy, 2 pinned
copy, 3 stream synchronize, 4 stream query, 5 stream create and destroy, 6 context synchronize, 7 and 8
event record, 9 stream wait on an event, 10 event query, 11 event synchronize); with --more, a third of
the operations are then drawn from --more's list. --threads=N runs bursts of N threads (default 4);
--serialize makes them take turns, one operation at a time. --no-special leaves the legacy and per-thread
default streams out; --legacy-only and --per-thread-only keep one of them. --drain makes each thread
synchronize its per-thread default stream before it exits. --pool-legacy makes the pool allocations and
frees (12, 13, 16) drawn for the per-thread default stream on the legacy stream instead.
"""

import os
import random
import subprocess
import sys
import threading
import time

from cuda.bindings import driver as drv

N_STREAMS, N_EVENTS, N = 4, 6, 4 << 20


def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    if err not in (drv.CUresult.CUDA_SUCCESS, drv.CUresult.CUDA_ERROR_NOT_READY):
        raise RuntimeError(err)
    return r[1] if isinstance(r, tuple) and len(r) == 2 else None


def child(seconds: float, events: bool, more: list[int], base: list[int]) -> int:
    ok(drv.cuInit(0))
    dev = ok(drv.cuDeviceGet(0))
    ctx = ok(drv.cuDevicePrimaryCtxRetain(dev))
    ok(drv.cuCtxSetCurrent(ctx))
    streams = [ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)) for _ in range(N_STREAMS - 1)]
    streams.append(ok(drv.cuStreamCreate(0)))  # blocking: synchronizes with the legacy stream
    specials = [drv.CUstream(0), drv.CUstream(2)]  # legacy, per-thread
    if "--no-special" in sys.argv:
        specials = []
    elif "--legacy-only" in sys.argv:
        specials = [drv.CUstream(0)]
    elif "--per-thread-only" in sys.argv:
        specials = [drv.CUstream(2)]
    evs = [ok(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING if i % 2 else 0)) for i in range(N_EVENTS)]
    bufs = [ok(drv.cuMemAlloc(N)) for _ in range(4)]
    pool = ok(drv.cuDeviceGetDefaultMemPool(dev))
    ok(drv.cuMemPoolSetAttribute(pool, drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, drv.cuuint64_t(2**64 - 1)))
    for flag, attr in (("--no-internal-deps", "CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES"),
                       ("--no-opportunistic", "CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC")):  # fmt: skip
        if flag in sys.argv:
            ok(drv.cuMemPoolSetAttribute(pool, getattr(drv.CUmemPool_attribute, attr), drv.cuuint32_t(0)))
    pinned = ok(drv.cuMemHostAlloc(N, 0))
    host = bytearray(64 << 10)
    progress = [0]
    stop = time.monotonic() + seconds

    pool_legacy = "--pool-legacy" in sys.argv

    def op(rng: random.Random) -> None:
        s = rng.choice(streams + specials)
        pool_s = drv.CUstream(0) if pool_legacy and int(s) == 2 else s
        k = rng.choice(base) if base else rng.randrange(12 if events else 7)
        if more and (not base or rng.randrange(3) == 0):
            k = rng.choice(more)
        if k == 12:
            p = ok(drv.cuMemHostAlloc(rng.choice((4096, 1 << 20)), 0))
            ok(drv.cuMemFreeHost(p))
        elif k == 13:
            d = ok(drv.cuMemAllocFromPoolAsync(rng.choice((256, 1 << 20)), pool, pool_s))
            ok(drv.cuMemFreeAsync(d, rng.choice(streams)))
        elif k == 16:
            d = ok(drv.cuMemAllocFromPoolAsync(rng.choice((256, 1 << 20)), pool, pool_s))
            ok(drv.cuMemFreeAsync(d, pool_s))
        elif k == 14:
            e = ok(drv.cuEventCreate(0))
            ok(drv.cuEventRecord(e, s))
            ok(drv.cuEventRecord(evs[0], s))
            ok(drv.cuEventDestroy(e))
        elif k == 15:
            ok(drv.cuMemPoolTrimTo(pool, 0))
            ok(drv.cuMemGetInfo())
        elif k == 0:
            ok(drv.cuMemcpyDtoDAsync(rng.choice(bufs), rng.choice(bufs), rng.choice((4096, N)), s))
        elif k == 1:
            ok(drv.cuMemcpyHtoD(rng.choice(bufs), host, len(host)))
        elif k == 2:
            ok(drv.cuMemcpyHtoDAsync(rng.choice(bufs), pinned, rng.choice((4096, N)), s))
        elif k == 3:
            ok(drv.cuStreamSynchronize(s))
        elif k == 4:
            ok(drv.cuStreamQuery(s))
        elif k == 5:
            t = ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
            ok(drv.cuMemcpyDtoDAsync(bufs[0], bufs[1], 4096, t))
            ok(drv.cuStreamDestroy(t))
        elif k == 6:
            ok(drv.cuCtxSynchronize())
        elif k in (7, 8):
            ok(drv.cuEventRecord(rng.choice(evs), s))
        elif k == 9:
            ok(drv.cuStreamWaitEvent(s, rng.choice(evs), 0))
        elif k == 10:
            ok(drv.cuEventQuery(rng.choice(evs)))
        else:
            ok(drv.cuEventSynchronize(rng.choice(evs)))

    serialize = threading.Lock() if "--serialize" in sys.argv else None
    drain = "--drain" in sys.argv

    def burst_thread(seed: int) -> None:
        ok(drv.cuCtxSetCurrent(ctx))
        rng = random.Random(seed)
        for _ in range(30):
            if serialize is not None:
                with serialize:
                    op(rng)
            else:
                op(rng)
            progress[0] += 1
        if drain:
            ok(drv.cuStreamSynchronize(drv.CUstream(2)))  # this thread's per-thread default stream

    n_threads = next((int(a[10:]) for a in sys.argv if a.startswith("--threads=")), 4)
    seed = os.getpid()
    last, last_t = -1, time.monotonic()
    while time.monotonic() < stop:
        ts = [threading.Thread(target=burst_thread, args=(seed + i,), daemon=True) for i in range(n_threads)]
        seed += n_threads
        for t in ts:
            t.start()
        for t in ts:
            while t.is_alive():
                t.join(1)
                if progress[0] != last:
                    last, last_t = progress[0], time.monotonic()
                elif time.monotonic() - last_t > 15:
                    print(f"pid {os.getpid()}: HANG after {progress[0]} operations", flush=True)
                    os._exit(3)
    ok(drv.cuCtxSynchronize())
    print(f"pid {os.getpid()}: {progress[0]} operations, no hang", flush=True)
    return 0


def main() -> int:
    if sys.argv[1] == "--child":
        more = [int(k) for a in sys.argv if a.startswith("--more=") for k in a[7:].split(",")]
        base = [int(k) for a in sys.argv if a.startswith("--ops=") for k in a[6:].split(",")]
        return child(float(sys.argv[2]), "--no-events" not in sys.argv, more, base)
    procs, seconds = int(sys.argv[1]), sys.argv[2]
    extra = [a for a in sys.argv[3:] if a.startswith("--")]
    ps = [subprocess.Popen([sys.executable, __file__, "--child", seconds, *extra]) for _ in range(procs)]
    codes = [p.wait() for p in ps]
    print(f"{procs} processes: exit codes {codes}")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())

"""The stress workload of the threads-and-processes tests (tests/test_stress.py), also runnable alone:

    python tests/stress.py --threads 16 --seconds 20        # prints one JSON line of counts

Each thread, on its own non-blocking stream, for a bounded time: allocates buffers of random sizes, fills
a pinned buffer with fresh random bytes, copies host->device, device->device and device->host
asynchronously, and checks every byte; every few rounds it captures those copies into a graph and replays
it several times with fresh data, checking every byte again; one thread in eight also runs into out of
memory on purpose and carries on. At the end it reports what ran and the allocator's counters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from contextlib import closing

import numpy as np

import cudacore as cc

MiB = 1 << 20
_counts_lock = threading.Lock()  # guards the shared counts dict as threads add theirs


def worker(dev: cc.Device, seed: int, deadline: float, counts: dict[str, int], oom_thread: bool) -> None:
    rng = random.Random(seed)
    ops = dict.fromkeys(("allocations", "copies", "captures", "replays", "checked_bytes", "ooms"), 0)
    with closing(dev.create_stream(non_blocking=True)) as s:
        while time.monotonic() < deadline:
            size = rng.choice((256, 4096, 65536, rng.randrange(1, 4 * MiB)))
            src_host = dev.allocate_pinned(size)
            out_host = dev.allocate_pinned(size)
            src = out = None
            try:
                with dev.allocate(size, stream=s) as a, dev.allocate(size, stream=s) as b:
                    ops["allocations"] += 2
                    src = src_host.numpy()
                    out = out_host.numpy()
                    if rng.random() < 0.2:
                        # Not "global": a global capture forbids the other threads' synchronizes by design
                        # (the driver's 900, which cudacore reports as CaptureError before calling it).
                        with s.capture(mode=rng.choice(("thread_local", "relaxed"))) as graph:
                            a.copy_from(src_host, stream=s)
                            cc.device_to_device(b, a, stream=s)
                            b.copy_to(out_host, stream=s)
                        ops["captures"] += 1
                        with graph:
                            for _ in range(rng.randrange(1, 6)):
                                src[:] = np.frombuffer(rng.randbytes(size), dtype=np.uint8)
                                out[:] = 0
                                graph.launch(s)
                                s.synchronize()
                                if out.tobytes() != src.tobytes():
                                    raise AssertionError(f"graph replay corrupted {size} bytes (seed {seed})")
                                ops["replays"] += 1
                                ops["checked_bytes"] += size
                    else:
                        src[:] = np.frombuffer(rng.randbytes(size), dtype=np.uint8)
                        a.copy_from(src_host, stream=s)
                        cc.device_to_device(b, a, stream=s)
                        b.copy_to(out_host, stream=s)
                        s.synchronize()
                        ops["copies"] += 3
                        if out.tobytes() != src.tobytes():
                            raise AssertionError(f"copy corrupted {size} bytes (seed {seed})")
                        ops["checked_bytes"] += size
            finally:
                del src, out  # the numpy views, before the memory they view is freed
                src_host.close()
                out_host.close()
            # The first pass always runs out of memory (so a slow, loaded machine still sees one), later
            # passes at random.
            if oom_thread and (ops["ooms"] == 0 or rng.random() < 0.05):
                try:
                    dev.allocate(2 * dev.total_memory, stream=s)
                except cc.OutOfMemoryError:
                    ops["ooms"] += 1
    with _counts_lock:
        for k, v in ops.items():
            counts[k] = counts.get(k, 0) + v


def run(threads: int, seconds: float, seed: int) -> dict[str, object]:
    dev = cc.Device(0)
    # A warm-up first, of the same shape as the run (the threads, their streams, captures and an out of
    # memory): on the H100 the driver reserves 8 MiB of device memory for itself on the way and keeps it.
    # That is not a leak of ours, so the free-memory baseline is taken after it.
    warm = [threading.Thread(target=worker, args=(dev, seed + i, time.monotonic() + 0.5, {}, True)) for i in range(threads)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    try:
        dev.allocate(2 * dev.total_memory)
    except cc.OutOfMemoryError:
        pass
    dev.synchronize()
    dev.release_cached_memory()
    before = dev.memory_stats()
    free_before = dev.memory_info()[0]
    counts: dict[str, int] = {}
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def guarded(i: int) -> None:
        try:
            worker(dev, seed * 1000 + i, deadline, counts, oom_thread=(i % 8 == 0))
        except BaseException as exc:  # noqa: BLE001 - reported in the result
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    ts = [threading.Thread(target=guarded, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=seconds + 120)
    hung = sum(t.is_alive() for t in ts)
    dev.synchronize()
    dev.release_cached_memory()
    after = dev.memory_stats()
    return {
        "pid": os.getpid(),
        "threads": threads,
        "seconds": seconds,
        "counts": counts,
        "errors": errors,
        "hung_threads": hung,
        "in_use_before": before["in_use"],
        "in_use_after": after["in_use"],
        "pinned_in_use_after": after["pinned_in_use"],
        "free_drift": free_before - dev.memory_info()[0],
        "allocations": after["allocations"] - before["allocations"],
        "frees": after["frees"] - before["frees"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(run(args.threads, args.seconds, args.seed)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

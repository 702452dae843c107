"""Copy + synchronize, cudacore against raw cuda.bindings, pinned and pageable asynchronous host-to-device
copies at a few sizes, interleaved over rounds; medians in GB/s and the ratio. The short form of
bench/copies.py's asynchronous rows, for checking the wait path on the GPU machine."""

import statistics
import sys
import time

sys.path.insert(0, "bench")
from copies import bindings_copy, cudacore_copy

for pinned in (True, False):
    for n in (64 << 10, 1 << 20, 16 << 20):
        cs = [cudacore_copy(n, pinned, True), bindings_copy(n, pinned, True)]
        res: dict[str, list[float]] = {c.name: [] for c in cs}
        reps = max(5, min(2000, (256 << 20) // n // 4))
        for _ in range(7):
            for c in cs:
                c.run()
                t0 = time.perf_counter()
                for _i in range(reps):
                    c.run()
                res[c.name].append(n * reps / (time.perf_counter() - t0) / 1e9)
        a, b = statistics.median(res["cudacore"]), statistics.median(res["cuda.bindings"])
        kind = "pinned" if pinned else "pageable"
        print(f"{kind:<9} {n >> 10:>6} KiB  cudacore {a:6.2f} GB/s  bindings {b:6.2f} GB/s  ratio {a / b:.2f}")
        for c in cs:
            if c.teardown:
                c.teardown()

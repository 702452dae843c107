"""The flight recorder's cost against its ring's capacity, on the GPU machine: the alloc+free pair with the
recorder off and on at several capacities, interleaved over rounds; medians, and the median of per-round
overheads against "off". A cost that grows with the capacity is the ring's cache footprint (each event
writes a slot that has left the core's caches since the ring last wrapped).

    python scripts/gpu/recorder_capacity.py
"""

import statistics
import time

import cudacore as cc

d = cc.Device(0); alloc = d.allocate
for _ in range(20000): alloc(256).close()
caps = [512, 4096, 65536]
names = ["off"] + [f"on cap {c}" for c in caps]
t = {n: [] for n in names}
for r in range(41):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
        if n == "off":
            cc.configure_flight_recorder(enabled=False)
        else:
            cc.configure_flight_recorder(enabled=True, capacity=int(n.split()[-1]))
        t0 = time.perf_counter()
        for _ in range(4000): alloc(256).close()
        t[n].append((time.perf_counter() - t0) / 4000 * 1e9)
base = t["off"]
for n in names:
    ratio = statistics.median(a / b - 1 for a, b in zip(t[n], base, strict=True))
    print(f"{n:<14} {statistics.median(t[n]):7.0f} ns  {ratio*100:+.1f}%")

"""Where a Graph.launch's host time goes, on the GPU machine: the public method, the fast entry alone,
gopy's entry, and an empty fast call, interleaved over rounds; medians in ns per call."""

import statistics
import time

import cudacore as cc
from cudacore._native import core, fast

d = cc.Device(0)
s = d.create_stream()
a, b = d.allocate(4096, stream=s), d.allocate(4096, stream=s)
with s.capture() as g:
    cc.device_to_device(b, a, stream=s)
g.upload(s)
s.synchronize()
N = 2000
variants = {
    "Graph.launch (public)": lambda: g.launch(s),
    "fast.graph_launch": lambda: fast.graph_launch(g._id, 0, s.handle),
    "core.GraphLaunch (gopy)": lambda: core.GraphLaunch(g._id, 0, s.handle),
    "fast.noop": lambda: fast.noop(1),
}
res = {k: [] for k in variants}
for _ in range(9):
    for name, f in variants.items():
        t0 = time.perf_counter()
        for _i in range(N):
            f()
        res[name].append((time.perf_counter() - t0) / N * 1e9)
        s.synchronize()
for name, v in res.items():
    print(f"{name:<28} {statistics.median(v):8.0f} ns")

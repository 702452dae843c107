"""Where the time of a launch whose arguments are another library's arrays goes, on the GPU machine.

A launch with CuPy arrays for pointer parameters reads each array's __cuda_array_interface__; this script
times that read alone, the same launch with the arrays' addresses as integers, and with the arrays, rounds
interleaved, medians in ns per call (single calls on an idle stream, so the host cost shows).

    python scripts/gpu/cai_probe.py
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from hot_paths import PTX, _cupy_module  # type: ignore[import-not-found]

import cudacore as cc

d = cc.Device(0)
s = d.create_stream()
k = d.load_module(PTX.encode()).function("empty4")
ca, cb = cupy.empty(1 << 18, dtype=cupy.float32), cupy.empty(1 << 18, dtype=cupy.float32)
ck = _cupy_module(cupy).get_function("empty4")
cs = cupy.cuda.ExternalStream(s.handle)
rows: list[tuple[str, Callable[[], object]]] = [
    ("CuPy RawKernel", lambda: ck((1,), (1,), (ca, cb, np.uint32(7), np.float32(1.5)), stream=cs)),
    ("read ca.__cuda_array_interface__", lambda: ca.__cuda_array_interface__),
    ("cudacore launch, integer addresses", lambda: k.launch(1, 1, (ca.data.ptr, cb.data.ptr, 7, 1.5), stream=s)),
    ("cudacore launch, CuPy arrays", lambda: k.launch(1, 1, (ca, cb, 7, 1.5), stream=s)),
]
res: dict[str, list[float]] = {n: [] for n, _ in rows}
for _ in range(7):
    for name, fn in rows:
        ts = []
        for _ in range(300):
            s.synchronize()
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
        res[name].append(statistics.median(ts))
for name, _ in rows:
    print(f"{name:<40} {statistics.median(res[name]):9.0f} ns")
pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    k.launch(1, 1, (ca, cb, 7, 1.5), stream=s)
pr.disable()
s.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(15)

# Which step of the C path refuses another library's array: the argument as it is, the same interface on a
# plain Python object, and the pieces the C path reads.
from cudacore._native import fast


class Wrapped:
    def __init__(self, a: object) -> None:
        self.cai = a.__cuda_array_interface__  # type: ignore[attr-defined]

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.cai


cai = ca.__cuda_array_interface__
print("data entry types:", type(cai), type(cai["data"]), type(cai["data"][0]), "buffer protocol:", end=" ")
try:
    memoryview(ca)  # type: ignore[arg-type]
    print("yes")
except TypeError:
    print("no")
for label, args in (("CuPy arrays", (ca, cb, 7, 1.5)), ("wrapped interfaces", (Wrapped(ca), Wrapped(cb), 7, 1.5)),
                    ("integers", (ca.data.ptr, cb.data.ptr, 7, 1.5))):
    r = fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, s.handle, args, k._spec)
    print(f"fast.launch with {label}: {'general path' if r is NotImplemented else 'packed in C'}")
s.synchronize()

"""Probe the real driver's limit behaviour (defaults, clamping, refusals) through cudacore.

Run on the GPU machine: CUDACORE_BACKEND=cuda PYTHONPATH=gpu-site python3 scripts/gpu/probe_limits.py
Its output is what the simulator's limits should reproduce (see issue 5).
"""

import warnings

import cudacore as cc

warnings.simplefilter("always")
d = cc.Device(0)
L = d.limits
print("props", {k: d.properties[k] for k in ("l2_cache_size", "max_persisting_l2_cache_size")})
print("defaults", L.as_dict())


def t(name, v):
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            a = L.set(name, v)
        print(f"set {name}={v}: applied {a}", [str(w.message)[:90] for w in rec])
    except (cc.CUDAError, ValueError, TypeError) as e:
        print(f"set {name}={v}: {type(e).__name__}: {str(e)[:300]}")


for name, v in [
    ("persisting_l2_cache_size", 0),
    ("persisting_l2_cache_size", 51904512),
    ("persisting_l2_cache_size", 52428800),
    ("persisting_l2_cache_size", 1 << 20),
    ("max_l2_fetch_granularity", 128),
    ("max_l2_fetch_granularity", 32),
    ("max_l2_fetch_granularity", 0),
    ("stack_size", 4096),
    ("stack_size", 512 << 10),
    ("stack_size", 1000),
    ("dev_runtime_sync_depth", 4),
    ("dev_runtime_pending_launch_count", 4096),
    ("dev_runtime_pending_launch_count", 1 << 30),
    ("printf_fifo_size", 1 << 30),
    ("printf_fifo_size", 64 << 40),
    ("malloc_heap_size", 100),
    ("malloc_heap_size", 0),
]:
    t(name, v)

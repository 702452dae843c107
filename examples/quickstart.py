"""A first look at cudacore: devices and their allocation strategy.

Run with a GPU, or anywhere with the simulator: ``CUDACORE_BACKEND=sim python examples/quickstart.py``.
"""

import cudacore as cc

print(f"backend: {cc.backend()}, CUDA driver {'.'.join(map(str, cc.driver_version()))}")
for d in cc.devices():
    free, total = d.memory_info()
    print(d)
    print(f"  {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")
    print(f"  allocator: {d.allocation_strategy} - {d.allocation_strategy_reason}")

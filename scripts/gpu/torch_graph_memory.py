"""Device memory across repeated PyTorch graph captures, on cudacore's allocator and on PyTorch's own,
on the GPU machine: what PyTorch's test_repeat_graph_capture_cublas_workspace_memory measures (100
captures of one matmul; device memory in use must not grow by 0.1 GB), with the numbers behind it.

    python scripts/gpu/torch_graph_memory.py cudacore|own
"""

from __future__ import annotations

import sys

import torch

import cudacore as cc

if sys.argv[1:] == ["cudacore"]:
    cc.interop.use_torch_allocator()
d = cc.Device(0)


def used() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 1e6


def graph_mem() -> str:
    try:
        from cuda.bindings import driver as drv

        attrs = {"used": drv.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
                 "reserved": drv.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT}
        return " ".join(f"graph-{k} {int(drv.cuDeviceGetGraphMemAttribute(0, a)[1]) / 1e6:.1f} MB" for k, a in attrs.items())
    except Exception as exc:  # noqa: BLE001 - a probe: say why and go on
        return f"(graph memory attributes unread: {exc})"


torch.backends.cuda.preferred_blas_library("cublas")
a = torch.rand((1024, 512), device="cuda")
b = torch.rand((512, 64), device="cuda")
torch.mm(a, b)
torch.cuda.synchronize()
before = used()
print(f"{sys.argv[1]}: before {before:.1f} MB used; {graph_mem()}")
for i in range(100):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.mm(a, b)
    g.replay()
    if i in (0, 1, 9, 99):
        torch.cuda.synchronize()
        stats = d.memory_stats()
        print(f"  after capture {i + 1}: +{used() - before:.1f} MB used; cudacore in_use {stats['in_use'] / 1e6:.1f} MB "
              f"reserved {stats['reserved'] / 1e6:.1f} MB; {graph_mem()}")

"""Memory, statistics over time, DLPack and fault injection in one script (typed: `make typecheck`).

Run anywhere with the simulator: ``CUDACORE_BACKEND=sim python examples/memory_tour.py``.
"""

from __future__ import annotations

import numpy as np

import cudacore as cc
from cudacore import interop, testing


def main() -> None:
    d = cc.Device(0)
    with cc.MemoryRecorder(d) as rec:
        with d.allocate(1 << 20) as buf:
            buf.copy_from(np.arange(1 << 18, dtype=np.float32))
            rec.sample("1 MiB")
            view: cc.ExternalBuffer = interop.from_dlpack(buf)  # what torch.from_dlpack(buf) does
            out = np.empty(1 << 18, dtype=np.float32)
            view.copy_to(out)
            view.close()
            assert out[100] == 100.0
        tiles = d.allocate_tiles(4, 1 << 20)
        rec.sample("4 tiles")
        for t in tiles:
            t.close()
    for row in rec.to_rows(["label", "in_use", "cached"]):
        print(row)
    stats: cc.MemoryStats = d.memory_stats()
    print("allocations:", stats["allocations"], "in use:", stats["in_use"])
    if cc.backend() == "sim":
        d.release_cached_memory()
        testing.fail_allocations(nth=1)
        try:
            d.allocate(1 << 20)
        except cc.OutOfMemoryError as exc:
            print("injected:", exc.name)
        finally:
            testing.clear_faults()


if __name__ == "__main__":
    main()

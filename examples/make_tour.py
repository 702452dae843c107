"""Writes examples/tour.ipynb (nbformat 4 JSON, no outputs): `python examples/make_tour.py`.

The notebook runs on the simulator when no GPU is there (its first cell sets CUDACORE_BACKEND=sim unless
the variable is set); tests/test_notebooks.py executes it in CI.
"""

from __future__ import annotations

import json
from pathlib import Path

CELLS: list[tuple[str, str]] = [
    ("markdown", ("# A tour of cudacore\n\nDevices, memory, statistics over time and interop. "
                 "Runs on the simulator (`CUDACORE_BACKEND=sim`) when there is no GPU.")),
    ("code", ("import os\n\nos.environ.setdefault(\"CUDACORE_BACKEND\", \"sim\")  # before cudacore is first used\n"
             "import cudacore as cc\n\nprint(cc.backend(), cc.device_count(), \"device(s)\")")),
    ("markdown", "## The device\nA `Device` shows its properties as a table."),
    ("code", "d = cc.Device(0)\nd"),
    ("markdown", "## Memory\nBuffers are freed by `close()`, the end of a `with` block, or garbage collection."),
    ("code", ("import numpy as np\n\nbuf = d.allocate(1 << 20)\nbuf.copy_from(np.arange(1 << 18, dtype=np.float32))\n"
             "out = np.empty(1 << 18, dtype=np.float32)\nbuf.copy_to(out)\nassert out[12345] == 12345.0\nbuf")),
    ("code", "d.memory_stats()"),
    ("markdown", ("## Memory over time\n`MemoryRecorder` samples `memory_stats()` in the background "
                 "(`interval_ms`) or on `.sample()`.")),
    ("code", ("with cc.MemoryRecorder(d) as rec:\n"
             "    tiles = d.allocate_tiles(8, 4 << 20)\n    rec.sample(\"8 tiles\")\n"
             "    for t in tiles[:4]:\n        t.close()\n    rec.sample(\"4 closed\")\n"
             "    for t in tiles[4:]:\n        t.close()\n    rec.sample(\"all closed\")\nrec")),
    ("code", "[(r[\"label\"], r[\"in_use\"]) for r in rec.to_rows()]"),
    ("markdown", "`plot()` draws the counters with matplotlib; the notebook shows the figure below the cell."),
    ("code", ("try:\n    rec.plot()\nexcept ImportError:\n"
             "    print(\"matplotlib is not installed: no plot (pip install matplotlib)\")")),
    ("markdown", "## Out of memory\nAn `OutOfMemoryError` is also a `MemoryError`, and says what to try."),
    ("code", ("d.memory_limit = 64 << 20\ntry:\n    d.allocate(128 << 20)\nexcept MemoryError as exc:\n"
             "    print(type(exc).__name__, \"-\", exc)\nfinally:\n    d.memory_limit = None")),
    ("markdown", ("## Interop\nA Buffer exports DLPack and the CUDA Array Interface; `cc.asbuffer` takes "
                 "CuPy/PyTorch/Numba arrays (and DLPack producers) without a copy.")),
    ("code", "buf.__dlpack_device__(), buf.__cuda_array_interface__[\"shape\"]"),
    ("code", ("view = cc.interop.from_dlpack(buf)  # what torch.from_dlpack(buf) does, here with cudacore\n"
             "view.copy_to(out)\nprint(view, out[:4])\nview.close()")),
    ("code", "buf.close()\nd.memory_stats()[\"in_use\"]"),
]


def notebook() -> dict:
    cells = []
    for kind, source in CELLS:
        cell: dict = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def main() -> None:
    path = Path(__file__).with_name("tour.ipynb")
    nb = notebook()
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"cell-{i}"
    path.write_text(json.dumps(nb, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Notebook support: rich reprs, MemoryRecorder, and the example notebook executed with nbclient."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

import cudacore as cc

ROOT = Path(__file__).resolve().parent.parent


def test_device_and_buffer_html() -> None:
    d = cc.Device(0)
    page = d._repr_html_()
    assert "<table>" in page and d.name in page and "allocator" in page
    with d.allocate(3000) as buf:
        page = buf._repr_html_()
        assert f"0x{buf.ptr:x}" in page and "3,000 B" in page
    assert "closed" in buf._repr_html_()


def test_memory_stats_is_a_dict_with_html() -> None:
    stats = cc.Device(0).memory_stats()
    assert isinstance(stats, dict) and isinstance(stats, cc.MemoryStats)
    assert dict(stats) == stats and "in_use" in stats
    page = stats._repr_html_()
    assert "in_use" in page and "no limit" in page


def test_recorder_explicit_samples() -> None:
    d = cc.Device(0)
    with cc.MemoryRecorder(d) as rec:
        base = rec.samples[0]["in_use"]
        buf = d.allocate(1 << 20)
        rec.sample("one MiB")
        buf.close()
    rows = rec.to_rows()
    assert [r["label"] for r in rows] == ["start", "one MiB", "stop"]
    assert rows[1]["in_use"] == base + (1 << 20) and rows[2]["in_use"] == base
    assert all(rows[i]["t"] <= rows[i + 1]["t"] for i in range(len(rows) - 1))
    assert rec.to_rows(["label"]) == [{"label": "start"}, {"label": "one MiB"}, {"label": "stop"}]
    page = rec._repr_html_()
    assert "one MiB" in page and "3 samples" in page


def test_recorder_background_thread() -> None:
    with cc.MemoryRecorder(0, interval_ms=2) as rec:
        time.sleep(0.05)
    assert len(rec.samples) >= 5
    assert rec._thread is None
    with pytest.raises(ValueError):
        cc.MemoryRecorder(0, interval_ms=0)


def test_recorder_plot() -> None:
    rec = cc.MemoryRecorder(0)
    rec.start()
    rec.stop()
    try:
        import matplotlib
    except ImportError:
        with pytest.raises(ImportError, match="matplotlib"):
            rec.plot()
        return
    matplotlib.use("Agg")
    ax = rec.plot()
    assert ax.get_ylabel() == "MiB"


def test_tour_notebook_is_current() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import make_tour
    finally:
        sys.path.pop(0)
    import json

    nb = json.loads((ROOT / "examples" / "tour.ipynb").read_text())
    expected = make_tour.notebook()
    assert [c["source"] for c in nb["cells"]] == [c["source"] for c in expected["cells"]], (
        "examples/tour.ipynb is out of date: run python examples/make_tour.py"
    )


@pytest.mark.sim
def test_tour_notebook_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # The kernel is a fresh process: give it the package by an absolute path, and the simulator.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CUDACORE_BACKEND", "sim")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows the plot
    nb = nbformat.read(ROOT / "examples" / "tour.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    assert any("cudacore.Device(0)" in h for h in html)
    assert any("memory statistics" in h for h in html)
    assert any("samples" in h for h in html)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "sim" in text and "OutOfMemoryError" in text
    # The plot is shown as an image (matplotlib's inline backend), or the cell says why not.
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    if importlib.util.find_spec("matplotlib") is not None:
        assert len(images) == 1
    else:
        assert not images and "matplotlib is not installed" in text

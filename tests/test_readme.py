"""The README's example runs as written (on the simulator)."""

from __future__ import annotations

import re

from conftest import ROOT, run_python


def test_readme_python_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert block is not None, "the README has a Python example"
    r = run_python(block.group(1), {"CUDACORE_BACKEND": "sim"})
    assert r.returncode == 0, r.stderr
    assert "out of memory allocating 2.0 TiB" in r.stdout

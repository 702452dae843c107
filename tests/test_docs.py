"""Every code block of README.md and docs/**/*.md runs (markers and rules: tests/docblocks.py).

Python blocks run per file, in order, as one script (so ``if __name__ == "__main__":`` works as for a
reader's script); shell blocks run one by one in bash from the repository root, with ``python`` and
``cudacore`` meaning this interpreter and its package. On the simulator the blocks marked ``gpu`` are
skipped; with ``CUDACORE_BACKEND=cuda`` and a device they run too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docblocks import DOCS, LANGUAGES, ROOT, Block, all_blocks, blocks, python_source

from conftest import _plugin_autoloaded

ON_GPU = os.environ.get("CUDACORE_BACKEND") == "cuda"


def _env(tmp: Path) -> dict[str, str]:
    """This interpreter and package first on PATH and PYTHONPATH, the backend of this test run."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(sys.executable)
    cli = bin_dir / "cudacore"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cudacore "$@"\n')
    cli.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    # The cudacore this interpreter imports comes first (an installed wheel on the GPU machine, where the
    # sources hold no built extension); the sources are the fallback.
    env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH", ""), str(ROOT / "python")) if p])
    env["MPLBACKEND"] = "Agg"
    return env


def _gpu_count() -> int:
    import cudacore as cc

    return cc.device_count()


def _runs_here(b: Block) -> str | None:
    """Why the block does not run here, or None."""
    if b.skip is not None:
        return f"not run by this test: {b.skip}"
    if b.gpu and not ON_GPU:
        return "needs a GPU (CUDACORE_BACKEND=cuda)"
    if b.sim and ON_GPU:
        return "needs the simulator (its test hooks)"
    if b.devices > 1 and ON_GPU and _gpu_count() < b.devices:
        return f"needs {b.devices} GPUs"
    missing = b.missing()
    if missing:
        return f"needs {', '.join(missing)}"
    return None


def test_every_block_is_declared() -> None:
    found = all_blocks()
    assert len(found) > 10
    for b in found:
        assert b.language in LANGUAGES, f"{b.where}: a code block must name its language ({sorted(LANGUAGES)}), not {b.language!r}"
        if b.skip is not None:
            assert b.language in ("sh", "bash"), f"{b.where}: only shell blocks may be skipped; mark python blocks gpu or requires"
            assert b.skip, f"{b.where}: a skip marker needs its reason"


def test_blocks_are_found_with_markers() -> None:
    """The extraction itself: a fixture file with every kind of block and marker."""
    doc = ROOT / "docs" / "contributing" / "design.md"
    assert any(b.language == "text" for b in blocks(doc))
    readme = blocks(ROOT / "README.md")
    python = [b for b in readme if b.language == "python"]
    assert python and python[0].code.startswith("import cudacore as cc")
    assert ROOT.joinpath("README.md").read_text().splitlines()[python[0].line - 1] == python[0].code.splitlines()[0]


_PY_DOCS = [p for p in DOCS if any(b.language == "python" for b in blocks(p))]


@pytest.mark.parametrize("path", _PY_DOCS, ids=[str(p.relative_to(ROOT)) for p in _PY_DOCS])
def test_python_blocks_run(path: Path, tmp_path: Path) -> None:
    todo = [b for b in blocks(path) if b.language == "python"]
    run = [b for b in todo if _runs_here(b) is None]
    if not run:
        pytest.skip("; ".join(f"{b.where} {_runs_here(b)}" for b in todo))
    script = tmp_path / (path.stem.replace("-", "_") + "_md.py")
    script.write_text(python_source(path, run))
    env = _env(tmp_path)
    devices = max(b.devices for b in run)
    if devices > 1 and not ON_GPU:
        env["CUDACORE_SIM_DEVICES"] = json.dumps([{"name": f"sim-{i}"} for i in range(devices)])
    r = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    # The script's line numbers are the markdown file's.
    stderr = r.stderr.replace(str(script), str(path.relative_to(ROOT)))
    assert r.returncode == 0, f"a python block of {path.relative_to(ROOT)} failed:\n{stderr}"


_SHELL = [b for b in all_blocks() if b.language in ("sh", "bash")]


@pytest.mark.parametrize("block", _SHELL, ids=[b.where for b in _SHELL])
def test_shell_blocks_run(block: Block, tmp_path: Path) -> None:
    why = _runs_here(block)
    if why is not None:
        pytest.skip(why)
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, f"{block.where} failed:\n{r.stdout}\n{r.stderr}"


def test_readme_fault_example_fails_an_allocation() -> None:
    """The CUDACORE_SIM_FAULTS example of the README's table makes an allocation raise OutOfMemoryError."""
    text = (ROOT / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `CUDACORE_SIM_FAULTS`"))
    found = re.search(r"e\.g\. `([^`]+)`", row)
    assert found is not None
    code = """
import cudacore as cc
try:
    cc.Device(0).allocate(1 << 20)
except cc.OutOfMemoryError:
    print("oom")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env.update(CUDACORE_BACKEND="sim", CUDACORE_SIM_FAULTS=found.group(1))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "oom\n"


def test_docs_say_kernels_do_not_run_on_the_simulator() -> None:
    text = (ROOT / "docs" / "guide" / "testing-without-a-gpu.md").read_text()
    assert "Kernels do not run on the simulator" in text
    readme = (ROOT / "README.md").read_text()
    assert "kernels do not run on it" in readme


def test_pytest_plugin_example_passes(tmp_path: Path) -> None:
    """The plugin example of testing-without-a-gpu.md is a test file: run it with pytest on the simulator."""
    [block] = [b for b in blocks(ROOT / "docs" / "guide" / "testing-without-a-gpu.md") if "cudacore_faults" in b.code]
    (tmp_path / "test_example.py").write_text(block.code)
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    plugin = [] if _plugin_autoloaded() else ["-p", "cudacore.pytest_plugin"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugin, "-p", "no:cacheprovider", str(tmp_path / "test_example.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 passed, 1 skipped" in r.stdout

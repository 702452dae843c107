"""Every documented line type-checks: the python blocks of README.md and docs/*.md under ``mypy --strict``
and pyright (strict), against this checkout's package. Each checker's test skips only when that checker is
not installed (``make venv`` installs both). Also the typing fixes these checks rely on (Limits setters).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cudacore as cc
from docblocks import DOCS, ROOT, blocks, python_source


def _sources(tmp_path: Path) -> dict[Path, Path]:
    """One module per markdown file with python blocks, its line numbers the file's: {module: markdown}."""
    out: dict[Path, Path] = {}
    for doc in DOCS:
        todo = [b for b in blocks(doc) if b.language == "python" and not b.missing()]
        if todo:
            module = tmp_path / (doc.stem.replace("-", "_").replace(".", "_") + "_md.py")
            module.write_text(python_source(doc, todo))
            out[module] = doc
    assert len(out) >= 5
    return out


def _report(text: str, sources: dict[Path, Path]) -> str:
    for module, doc in sources.items():
        text = text.replace(str(module), str(doc.relative_to(ROOT))).replace(module.name, str(doc.relative_to(ROOT)))
    return text


def test_docs_pass_mypy_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (make venv installs it)")
    sources = _sources(tmp_path)
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), *map(str, sources)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, "mypy --strict on the documented code:\n" + _report(r.stdout + r.stderr, sources)


def _pyright() -> str | None:
    here = Path(sys.executable).parent / "pyright"
    return str(here) if here.exists() else shutil.which("pyright")


def test_docs_pass_pyright_strict(tmp_path: Path) -> None:
    pyright = _pyright()
    if pyright is None:
        pytest.skip("pyright is not installed (make venv installs it: pip install pyright)")
    sources = _sources(tmp_path)
    config = tmp_path / "pyrightconfig.json"
    config.write_text(
        json.dumps(
            {
                "include": [m.name for m in sources],
                "extraPaths": [str(ROOT / "python")],
                "typeCheckingMode": "strict",
                "pythonVersion": "3.10",
            }
        )
    )
    r = subprocess.run(
        [pyright, "-p", str(config), "--pythonpath", sys.executable],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, "pyright (strict) on the documented code:\n" + _report(r.stdout + r.stderr, sources)
    assert "0 errors" in r.stdout


def test_a_type_error_in_a_block_is_reported(tmp_path: Path) -> None:
    """The checkers see the blocks: a wrong line in an extracted module fails mypy (the test can fail)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    bad = tmp_path / "bad_md.py"
    bad.write_text("import cudacore as cc\n\nd = cc.Device(0)\nd.limits.malloc_heap_size = 'large'\n")
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(bad)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 1
    assert "bad_md.py:4: error: Incompatible types in assignment" in r.stdout


def test_a_type_error_in_a_block_is_reported_by_pyright(tmp_path: Path) -> None:
    pyright = _pyright()
    if pyright is None:
        pytest.skip("pyright is not installed")
    (tmp_path / "bad_md.py").write_text("import cudacore as cc\n\nd = cc.Device(0)\nd.limits.malloc_heap_size = 'large'\n")
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"include": ["bad_md.py"], "extraPaths": [str(ROOT / "python")], "typeCheckingMode": "strict"})
    )
    r = subprocess.run(
        [pyright, "-p", str(tmp_path / "pyrightconfig.json"), "--pythonpath", sys.executable],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 1
    assert "bad_md.py:4:" in r.stdout and "1 error" in r.stdout


# -- the typing of Limits ----------------------------------------------------------------------------


def test_limit_properties_have_setters() -> None:
    from cudacore._limits import LIMIT_NAMES

    for name in LIMIT_NAMES:
        prop = getattr(cc.Limits, name)
        assert isinstance(prop, property) and prop.fset is not None, name
    d = cc.Device(0)
    before = d.limits.stack_size
    d.limits.stack_size = 4096
    assert d.limits.stack_size == 4096
    d.limits.stack_size = before
    with pytest.raises(AttributeError, match="Limits has no limit 'stack'"):
        d.limits.stack = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        d.limits.stack_size = "big"  # type: ignore[assignment]


@pytest.mark.sim
def test_clamp_warning_points_at_the_assignment() -> None:
    d = cc.Device(0)
    before = d.limits.malloc_heap_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d.limits.malloc_heap_size = 64 << 40
        d.limits.set("malloc_heap_size", 64 << 40)
        d.limits["malloc_heap_size"] = 64 << 40
    d.limits.malloc_heap_size = before
    clamps = [w for w in caught if issubclass(w.category, cc.LimitClampedWarning)]
    assert len(clamps) == 3
    assert {w.filename for w in clamps} == {__file__}


@pytest.mark.sim
def test_unsupported_limit_raises_and_is_none_in_as_dict() -> None:
    d = cc.Device(0)
    with pytest.raises(cc.NotSupportedError, match="dev_runtime_sync_depth"):
        d.limits.dev_runtime_sync_depth  # noqa: B018 - reading is the test
    assert d.limits.as_dict()["dev_runtime_sync_depth"] is None

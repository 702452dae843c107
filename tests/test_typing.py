"""Every documented line type-checks: the python blocks of README.md and docs/**/*.md under ``mypy --strict``
and pyright (strict), against this checkout's package. Each checker's test skips only when that checker is
not installed (``make venv`` installs both). Also the typing fixes these checks rely on (Limits setters).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import typing
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


# -- mistakes the types catch ------------------------------------------------------------------------
#
# Each line of _MISTAKES must fail to type-check under both checkers, and _RIGHT (the same calls written
# correctly, with the types users rely on) must pass: the annotations do the work, not luck.

_PRELUDE = """\
from __future__ import annotations

import cudacore as cc

d = cc.Device(0)
s = d.create_stream()
buf = d.allocate(16)
"""

_MISTAKES = {
    "capture mode": 's.capture(mode="globl")',
    "begin_capture mode": 's.begin_capture("globl")',
    "memory_stats key": 'd.memory_stats()["no_such_key"]',
    "memory_stats value type": 'name: str = d.memory_stats()["in_use"]',
    "allocate stream": 'd.allocate(1, stream="x")',
    "allocate_tiles stream": 'd.allocate_tiles(2, 8, stream=1.5)',
    "copy_from stream": 'buf.copy_from(b"x" * 16, stream="x")',
    "copy_to nbytes": 'buf.copy_to(bytearray(16), nbytes="16")',
    "copy_from offset keyword": "buf.copy_from(bytes(16), offst=0)",
    "graph launch stream": 'cc.Graph.launch(s.capture().__enter__(), stream=b"s")',
    "wait on None": "s.wait(None)",
    "requested is not optional": "def f(e: cc.OutOfMemoryError) -> None:\n    x: None = e.requested",
    "cause is a verdict": 'def g(e: cc.OutOfMemoryError) -> bool:\n    return e.cause == 3',
    "fill stream": 'buf.fill(0, stream="x")',
    "device_to_device stream": 'cc.device_to_device(buf, buf, stream="x")',
    "rehearse stream": 'cc.rehearse(lambda st: None, stream=1.5)',
    "graphed call argument": "def h(x: cc.Buffer) -> None:\n    pass\ncc.graphed(h, stream=s)(1)",
}

_RIGHT = """
class Foreign:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, s.handle)


mode: cc.CaptureMode = "relaxed"
with s.capture(mode=mode) as graph:
    pass
in_use: int = d.memory_stats()["in_use"]
strategy: str = d.memory_stats()["strategy"]
tracking: bool = d.memory_stats()["tracking"]
streams: list[cc.StreamLike] = [s, s.handle, None, Foreign()]
for st in streams:
    d.allocate(8, stream=st).close()
buf.copy_from(bytes(16), s, nbytes=8, offset=8, src_offset=0)
buf.copy_to(bytearray(16), stream=Foreign(), nbytes=16)
s.synchronize()
s.wait(Foreign())
buf.fill(0, stream=Foreign())
cc.device_to_device(buf, buf, stream=s.handle)


def step(x: cc.Buffer, k: int = 0) -> cc.Buffer:
    return x


graphed_step = cc.graphed(step, stream=s)
kept: cc.Buffer = graphed_step(buf, 0)
try:
    d.allocate(1 << 60)
except cc.OutOfMemoryError as e:
    half: int = e.requested // 2
    verdict: cc.OutOfMemoryCause | None = e.cause
"""


def _mistakes_module(tmp_path: Path) -> tuple[Path, dict[str, int], Path]:
    """The mistakes, one per line range, in one module ({name: its first line}), and the right module."""
    lines = _PRELUDE.splitlines()
    where: dict[str, int] = {}
    for name, code in _MISTAKES.items():
        where[name] = len(lines) + 1
        lines.extend(code.splitlines())
    bad = tmp_path / "mistakes_md.py"
    bad.write_text("\n".join(lines) + "\n")
    right = tmp_path / "right_md.py"
    right.write_text(_PRELUDE + _RIGHT)
    return bad, where, right


def _error_lines(output: str, name: str, pattern: str) -> set[int]:
    return {int(m) for m in re.findall(rf"{re.escape(name)}:(\d+)" + pattern, output)}


def _check_mistakes(where: dict[str, int], lines: set[int], checker: str, output: str) -> None:
    ends = sorted(where.values()) + [10**9]
    missed = [
        name for name, first in where.items() if not any(first <= n < ends[ends.index(first) + 1] for n in lines)
    ]
    assert not missed, f"{checker} accepts these mistakes: {missed}\n{output}"


def test_mypy_refuses_the_mistakes(tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (make venv installs it)")
    bad, where, right = _mistakes_module(tmp_path)
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    cmd = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache")]
    r = subprocess.run([*cmd, str(bad)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    _check_mistakes(where, _error_lines(r.stdout, bad.name, r": error"), "mypy --strict", r.stdout)
    ok = subprocess.run([*cmd, str(right)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert ok.returncode == 0, "mypy --strict refuses correct code:\n" + ok.stdout + ok.stderr


def test_pyright_refuses_the_mistakes(tmp_path: Path) -> None:
    pyright = _pyright()
    if pyright is None:
        pytest.skip("pyright is not installed (make venv installs it: pip install pyright)")
    bad, where, right = _mistakes_module(tmp_path)
    for module, expect_errors in ((bad, True), (right, False)):
        config = tmp_path / f"pyrightconfig-{module.stem}.json"
        config.write_text(
            json.dumps(
                {
                    "include": [module.name],
                    "extraPaths": [str(ROOT / "python")],
                    "typeCheckingMode": "strict",
                    "pythonVersion": "3.10",
                    # The mistakes module's lines are expressions whose value is unused, on purpose.
                    "reportUnusedExpression": "none",
                    "reportUnusedCoroutine": "none",
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
        if expect_errors:
            assert r.returncode == 1, r.stdout + r.stderr
            _check_mistakes(where, _error_lines(r.stdout, module.name, r":\d+ - error"), "pyright", r.stdout)
        else:
            assert r.returncode == 0, "pyright (strict) refuses correct code:\n" + r.stdout + r.stderr


# -- the types agree with what runs ----------------------------------------------------------------------


def test_memory_stats_keys_and_types_are_the_typed_dicts() -> None:
    from typing import get_type_hints

    hints = get_type_hints(cc.MemoryStatsFields)
    stats = cc.Device(0).memory_stats()
    assert isinstance(stats, cc.MemoryStats) and type(stats).__name__ == "MemoryStats"
    assert set(stats) == set(hints), "memory_stats() and MemoryStatsFields disagree on the keys"
    for key, value in stats.items():
        want = hints[key]
        if typing.get_origin(want) is typing.Literal:
            assert value in typing.get_args(want), (key, value)
        elif typing.get_origin(want) is dict:
            k_type, v_type = typing.get_args(want)
            assert type(value) is dict and all(type(k) is k_type and type(v) is v_type for k, v in value.items()), (key, value)
        else:
            assert type(value) is want, (key, value, want)


def test_capture_modes_are_the_literal() -> None:
    assert typing.get_args(cc.CaptureMode) == cc._stream.CAPTURE_MODES == ("thread_local", "global", "relaxed")
    s = cc.Device(0).create_stream()
    with pytest.raises(cc.InvalidValueError, match="unknown capture mode 'globl'"):
        s.capture(mode="globl").__enter__()  # type: ignore[arg-type]
    s.close()


def test_out_of_memory_causes_are_go_s_verdicts() -> None:
    go = (ROOT / "pkg" / "memory" / "oom.go").read_text()
    verdicts = set(re.findall(r'^\s*Cause\w+\s*=\s*"(\w+)"', go, re.MULTILINE))
    assert verdicts and verdicts == set(typing.get_args(cc.OutOfMemoryCause))


@pytest.mark.sim
def test_out_of_memory_requested_is_an_int() -> None:
    d = cc.Device(0)
    with pytest.raises(cc.OutOfMemoryError) as info:
        d.allocate(1 << 50)
    e = info.value
    assert type(e.requested) is int and e.requested == 1 << 50
    assert e.cause in typing.get_args(cc.OutOfMemoryCause)
    # A driver out-of-memory with no size of its own (no 'requested' field) reads 0, not None.
    bare = cc.OutOfMemoryError("out of memory", code=2, name="CUDA_ERROR_OUT_OF_MEMORY", op="cuModuleLoadData")
    assert bare.requested == 0 and bare.cause is None


def test_stream_like_takes_the_stream_protocol() -> None:
    d = cc.Device(0)
    s = d.create_stream()

    class Foreign:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, s.handle)

    assert isinstance(s, cc.Stream)
    with d.allocate(64, stream=Foreign()) as buf:
        assert buf.stream_handle == s.handle
    s.synchronize()
    s.close()

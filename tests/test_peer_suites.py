"""scripts/gpu/peer_suites.py's bookkeeping, on a stand-in suite (no GPU, no peer library): a test that
breaks every later test of its process does not count their failures, a real failure stays one, a test
that kills its process is recorded as crashed and the file goes on without it, and the expected
differences match only what they name."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT

STAND_IN = textwrap.dedent(
    """
    import os

    state = {"poisoned": False}


    def test_1_poisoner():
        state["poisoned"] = True  # passes, and breaks every later test of this process


    def test_2_victim():
        assert not state["poisoned"]


    def test_3_real_failure():
        assert 1 == 2


    def test_4_crash():
        os._exit(139)  # dies as a segfault would, mid-test


    def test_5_fine():
        pass
    """
)


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_suites", ROOT / "scripts" / "gpu" / "peer_suites.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """peer_suites.py with every suite's root the stand-in suite, and no test-only wheels."""
    ps = _load()
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_stand_in.py").write_text(STAND_IN)
    monkeypatch.setattr(ps, "suite_root", lambda name: suite)
    monkeypatch.setattr(ps, "SUITES_DIR", tmp_path / "no-wheels")
    return ps


@pytest.mark.sim
def test_failures_count_only_when_a_test_fails_alone(stand_in: ModuleType, tmp_path: Path) -> None:
    ps = stand_in
    got = ps.run_file("cupy", "test_stand_in.py", "own", tmp_path / "out", 120, 2)
    by_name = {n.rsplit("::", 1)[-1]: o for n, o in got.items()}
    assert by_name == {
        "test_1_poisoner": "passed",
        "test_2_victim": "passed",  # failed after the poisoner, passed alone
        "test_3_real_failure": "failed",
        "test_4_crash": "crashed",
        "test_5_fine": "passed",  # run in the process started after the crash
    }
    # Every run left its transcript, for reading failures later.
    assert any(p.suffix == ".out" and "rerun" in p.name for p in (tmp_path / "out").iterdir())


@pytest.mark.sim
def test_expected_differences_match_only_what_they_name() -> None:
    ps = _load()
    node = "peer-suites/torch/test_cuda.py::TestCuda::test_get_per_process_memory_fraction"
    assert ps.expected("torch", node, "passed", "failed") is not None
    assert ps.expected("torch", node, "failed", "passed") is None  # cudacore passing where PyTorch fails is news
    assert ps.expected("torch", node.replace("fraction", "fraction_x"), "passed", "crashed") is None
    assert ps.expected("numba", "numba.cuda.tests.cudapy.test_ipc.TestIpcMemory.test_ipc_handle", "failed", "error")
    for suite, rows in ps.LEFT_OUT.items():
        for pattern, reason in rows:
            assert pattern and len(reason) > 20, (suite, pattern)


@pytest.mark.sim
def test_past_the_deadline_nothing_starts_and_the_output_is_still_tarred(
    stand_in: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tarfile
    import time

    ps = stand_in
    monkeypatch.setattr(ps, "DEADLINE", time.monotonic() - 1)
    assert ps.run_file("cupy", "test_stand_in.py", "own", tmp_path / "out", 120, 2) == {}
    # The whole run: the outcome files and the table are written, and the tarball holds them.
    out, tgz = tmp_path / "run", tmp_path / "run.tgz"
    monkeypatch.setattr("sys.argv", ["peer_suites.py", "--suite", "numba", "--only", "no such module", "--out", str(out),
                                     "--tar", str(tgz), "--deadline", "0"])
    assert ps.main() == 0
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
    assert "run/outcomes-numba-own.json" in names and "run/outcomes-numba-cudacore.json" in names


@pytest.mark.sim
def test_split_gpus_runs_each_allocator_on_a_gpu_of_its_own(
    stand_in: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    ps = stand_in
    # A unittest module, run as the Numba suite is (peer_unittest.py imports nothing of the peer's).
    (ps.suite_root("numba") / "lane_test.py").write_text(
        "import os\nimport unittest\n\n\nclass Lane(unittest.TestCase):\n    def test_lane(self):\n"
        "        want = {'own': '0', 'cudacore': '1'}[os.environ['CUDACORE_PEER_ALLOCATOR']]\n"
        "        self.assertEqual(os.environ.get('CUDA_VISIBLE_DEVICES'), want)\n"
    )
    monkeypatch.setitem(ps.SELECTED, "numba", ["lane_test"])
    monkeypatch.setattr(ps, "GPU_OF", {})
    monkeypatch.setenv("PYTHONPATH", str(ps.suite_root("numba")))
    out = tmp_path / "run"
    monkeypatch.setattr("sys.argv", ["peer_suites.py", "--suite", "numba", "--split-gpus", "--out", str(out)])
    assert ps.main() == 0
    for allocator in ("own", "cudacore"):
        got = json.loads((out / f"outcomes-numba-{allocator}.json").read_text())
        assert list(got.values()) == ["passed"], (allocator, got)


@pytest.mark.sim
@pytest.mark.parametrize(("left_out", "ran"), [
    ([], {"test_3_real_failure", "test_5_fine"}),
    ([("real_failure", "left out by this test")], {"test_5_fine"}),
])
def test_a_keyword_narrows_the_selection_with_the_left_out_tests_still_out(
    stand_in: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, left_out: list[tuple[str, str]], ran: set[str]
) -> None:
    ps = stand_in
    monkeypatch.setattr(ps, "KEYWORD", "fine or real")
    monkeypatch.setitem(ps.LEFT_OUT, "cupy", left_out)
    got = ps.run_file("cupy", "test_stand_in.py", "own", tmp_path / "out", 120, 0)
    assert {n.rsplit("::", 1)[-1] for n in got} == ran

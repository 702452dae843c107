"""cudacore's pytest plugin, run through pytester in fresh interpreters (the backend is chosen per process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.sim

CONFTEST = """
import os
os.environ.setdefault("CUDACORE_BACKEND", "sim")
"""


@pytest.fixture
def runner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "python"))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("CUDACORE_SIM_FAULTS", raising=False)
    pytester.makeconftest(CONFTEST)

    def run(*args: str, backend: str = "sim") -> pytest.RunResult:
        monkeypatch.setenv("CUDACORE_BACKEND", backend)
        return pytester.runpytest_subprocess("-p", "cudacore.pytest_plugin", "-p", "no:cacheprovider", *args)

    return run


def test_markers_registered_once(runner, pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    cudacore_gpu: the project's own line for it\n")
    result = runner("--markers")
    out = result.stdout.str()
    assert out.count("@pytest.mark.cudacore_gpu:") == 1
    for name in ("cudacore_leak_check", "cudacore_memory_budget", "cudacore_faults"):
        assert f"@pytest.mark.{name}" in out
    assert "@pytest.mark.gpu" not in out, "no marker of a common name"


def test_gpu_marker_skips_without_gpu_and_device_fixture(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cudacore_gpu
        def test_needs_gpu():
            raise AssertionError("must not run")

        def test_device(cudacore_device):
            assert cudacore_device.device_id == 0
            assert cudacore_device.total_memory > 0
        """
    )
    result = runner("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])


def test_a_projects_own_gpu_marker_is_left_alone(runner, pytester: pytest.Pytester) -> None:
    """Issue 31: a project's own @pytest.mark.gpu test, nothing to do with cudacore, runs under
    CUDACORE_BACKEND=sim (the plugin skipped it)."""
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the project's own marker\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_mine():
            pass
        """
    )
    runner("-m", "gpu", "-rs").assert_outcomes(passed=1)


SPY_CONFTEST = CONFTEST + """
import json
from cudacore._native import core

CALLS = []
for _name, _fn in list(vars(core).items()):
    def _spy(*args, _name=_name, _fn=_fn):
        CALLS.append(_name)
        return _fn(*args)
    setattr(core, _name, _spy)

def pytest_collection_finish(session):
    with open("calls_at_collection.json", "w") as f:
        json.dump(CALLS, f)
"""


@pytest.mark.parametrize("backend", ["cuda", "sim"])
def test_nothing_is_called_into_cudacore_at_collection(runner, pytester: pytest.Pytester, backend: str) -> None:
    """Issue 31: collecting tests that carry cudacore's markers (or a `gpu` marker) calls nothing of cudacore's,
    so CUDA is not initialised in pytest's process while it collects; the markers are checked when a marked
    test is set up."""
    pytester.makeconftest(SPY_CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the project's own marker\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu
        def test_own_gpu():
            pass

        @pytest.mark.cudacore_gpu
        def test_cudacore_gpu():
            raise AssertionError("must not run: no GPU here")

        @pytest.mark.cudacore_faults("cuMemAllocAsync:1:2")
        def test_faults():
            pass
        """
    )
    result = runner("-rs", backend=backend)
    assert json.loads((pytester.path / "calls_at_collection.json").read_text()) == []
    result.assert_outcomes(passed=1 if backend == "cuda" else 2, skipped=2 if backend == "cuda" else 1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])


def test_device_fixture_skips_without_driver(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_device(cudacore_device):
            raise AssertionError("must not run")
        """
    )
    result = runner("-rs", backend="cuda")  # no driver on this machine
    result.assert_outcomes(skipped=1)


LEAKY = """
import pytest
import cudacore as cc

KEEP = []

def helper_that_allocates():
    return cc.Device(0).allocate(12345)

@pytest.mark.cudacore_leak_check
def test_leaks():
    KEEP.append(helper_that_allocates())

@pytest.mark.cudacore_leak_check
def test_clean():
    with cc.Device(0).allocate(1000):
        pass
    cc.Device(0).allocate(2000)  # garbage: freed by the collector, not a leak

@pytest.fixture
def buf():
    b = cc.Device(0).allocate(4096)
    yield b
    b.close()

@pytest.mark.cudacore_leak_check
def test_fixture_buffer_is_not_a_leak(buf):
    assert buf.size == 4096

@pytest.mark.cudacore_leak_check(False)
def test_opted_out():
    KEEP.append(cc.Device(0).allocate(64))

def test_unchecked():
    KEEP.append(cc.Device(0).allocate(64))
"""


def test_leak_check_marker_names_the_call_site(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = runner("-v")
    result.assert_outcomes(passed=5, errors=1)
    out = result.stdout.str()
    assert "ERROR at teardown of test_leaks" in out
    result.stdout.fnmatch_lines(
        [
            "*cudacore leak check: 1 cudacore Buffer(s) still allocated after the test (12345 bytes)*",
            "*12345 bytes at 0x* on device 0, allocated at:*",
            "*test_leaky.py:11 in test_leaks*",
            "*KEEP.append(helper_that_allocates())*",
            "*test_leaky.py:7 in helper_that_allocates*",
            "*return cc.Device(0).allocate(12345)*",
        ]
    )
    assert "_multicall" not in out


def test_leak_check_finds_a_leaked_pinned_buffer(runner, pytester: pytest.Pytester) -> None:
    """Issue 11 #15: a PinnedBuffer left open is a leak too, named with its call site."""
    pytester.makepyfile(
        test_pinned_leak="""
        import pytest
        import cudacore as cc

        KEEP = []

        @pytest.mark.cudacore_leak_check
        def test_pinned_leak():
            KEEP.append(cc.Device(0).allocate_pinned(4321))

        @pytest.mark.cudacore_leak_check
        def test_pinned_closed():
            with cc.Device(0).allocate_pinned(4321):
                pass
        """
    )
    result = runner("-v")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*1 cudacore PinnedBuffer(s) still allocated after the test (4321 bytes)*",
            "*KEEP.append(cc.Device(0).allocate_pinned(4321))*",
        ]
    )


def test_leak_check_does_not_count_orphans(runner, pytester: pytest.Pytester) -> None:
    # A Buffer of another library's stream, closed after its owner destroyed the stream, waits for a
    # device synchronize before its memory goes back (docs/guide/memory.md): it was freed, so no leak.
    pytester.makepyfile(
        test_orphan="""
        import pytest
        import cudacore as cc
        from cudacore._api import core

        @pytest.mark.cudacore_leak_check
        def test_orphan():
            d = cc.Device(0)
            h = core.SimForeignStream(0, True)
            b = d.allocate(1 << 20, stream=h)
            core.SimForeignStreamDestroy(0, h)
            b.close()
            assert d.memory_stats()["orphaned"] == 1 << 20
        """
    )
    runner("-v").assert_outcomes(passed=1)


def test_leak_check_finds_a_leaked_managed_buffer(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_managed_leak="""
        import pytest
        import cudacore as cc

        KEEP = []

        @pytest.mark.cudacore_leak_check
        def test_managed_leak():
            KEEP.append(cc.Device(0).allocate_managed(5432))
        """
    )
    result = runner("-v")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*1 cudacore ManagedBuffer(s) still allocated after the test (5432 bytes)*",
            "*KEEP.append(cc.Device(0).allocate_managed(5432))*",
        ]
    )


def test_leak_check_flag_checks_every_test(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = runner("--cudacore-leak-check")
    result.assert_outcomes(passed=5, errors=2)  # test_unchecked leaks too now; the opt-out still holds


def test_leak_check_ini(runner, pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudacore_leak_check = true\n")
    pytester.makepyfile(
        """
        import cudacore as cc
        KEEP = []
        def test_tiles():
            KEEP.extend(cc.Device(0).allocate_tiles(3, 1 << 16))
        """
    )
    result = runner()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*3 cudacore Buffer(s) still allocated*196608 bytes*", "*in test_tiles*"])


def test_memory_budget(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import cudacore as cc

        @pytest.mark.cudacore_memory_budget(1 << 20)
        def test_over_budget():
            d = cc.Device(0)
            with d.allocate(512 << 10):
                pass
            with pytest.raises(cc.OutOfMemoryError, match="limit"):
                d.allocate(2 << 20)

        def test_budget_restored_after():
            with cc.Device(0).allocate(4 << 20):
                pass
            assert cc.Device(0).memory_limit is None
        """
    )
    runner().assert_outcomes(passed=2)


def test_memory_budget_without_a_size_is_a_clear_usage_error(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cudacore_memory_budget()
        def test_no_size():
            pass
        """
    )
    result = runner()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*cudacore_memory_budget needs the budget in bytes*"])
    assert "KeyError" not in result.stdout.str()


def test_faults_marker_and_fixture(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import cudacore as cc

        def my_code_with_fallback(nbytes):
            try:
                return cc.Device(0).allocate(nbytes), "device"
            except MemoryError:
                return bytearray(nbytes), "host"

        @pytest.mark.cudacore_faults("cuMemAllocFromPoolAsync:1:2,cuMemAllocFromPoolAsync:2:2")
        def test_marker():
            cc.Device(0).release_cached_memory()
            _, where = my_code_with_fallback(1 << 20)
            assert where == "host"

        def test_fixture(cudacore_faults):
            d = cc.Device(0)
            d.release_cached_memory()
            cudacore_faults.fail_allocations(nth=2)
            first, where1 = my_code_with_fallback(1 << 20)
            second, where2 = my_code_with_fallback(1 << 21)
            assert (where1, where2) == ("device", "host")
            first.close()

        def test_cleared_after():
            cc.Device(0).release_cached_memory()
            with cc.Device(0).allocate(1 << 20):
                pass
        """
    )
    runner().assert_outcomes(passed=3)


def test_faults_skip_on_real_backend(runner, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cudacore_faults("cuMemAllocAsync:1:2")
        def test_marker():
            raise AssertionError("must not run")

        def test_fixture(cudacore_faults):
            raise AssertionError("must not run")
        """
    )
    runner("-rs", backend="cuda").assert_outcomes(skipped=2)


def test_leak_check_finds_a_leaked_shared_buffer(runner, pytester: pytest.Pytester) -> None:
    """Issue 30, item 7: a SharedBuffer left open is a leak (memory_stats()["shared_in_use"] and the call
    site), also one made without Device.allocate_shareable."""
    pytester.makepyfile(
        test_shared_leak="""
        import pytest
        import cudacore as cc
        from cudacore import _ipc

        KEEP = []

        @pytest.mark.cudacore_leak_check
        def test_shared_leak():
            KEEP.append(cc.Device(0).allocate_shareable(4321))

        @pytest.mark.cudacore_leak_check
        def test_shared_leak_elsewhere():
            KEEP.append(_ipc.allocate_shareable(cc.Device(0), 1234))
        """
    )
    result = runner("-v")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*1 cudacore SharedBuffer(s) still allocated after the test (4321 bytes)*",
            "*KEEP.append(cc.Device(0).allocate_shareable(4321))*",
        ]
    )
    result.stdout.fnmatch_lines(["*device 0: 1234 bytes more shareable memory in use than before the test*"])

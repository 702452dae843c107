"""Issue 31: cudacore changes nothing it was not asked to, refuses bad settings, and its fault injection
is device-scoped, has one signature, takes a Device or an ordinal, and names injected failures."""

from __future__ import annotations

import inspect

import pytest

import cudacore as cc
from cudacore import testing
from cudacore.pytest_plugin import FaultInjector

from conftest import run_python

TWO_DEVICES = {
    "CUDACORE_BACKEND": "sim",
    "CUDACORE_SIM_DEVICES": '[{"name": "a", "total_memory": 1073741824}, {"name": "b", "total_memory": 1073741824}]',
}


def test_testing_is_an_attribute_of_the_package_without_importing_it() -> None:
    r = run_python("import sys\nimport cudacore as cc\nprint('cudacore.testing' in sys.modules)\n"
                   "print(cc.testing.fail_allocations.__module__)\n", {"CUDACORE_BACKEND": "sim"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "cudacore.testing"]
    with pytest.raises(AttributeError, match="no attribute 'testingg'"):
        cc.testingg  # noqa: B018


def test_fail_allocations_fails_the_named_device_only() -> None:
    code = """
import cudacore as cc
from cudacore import testing
d0, d1 = cc.Device(0), cc.Device(1)
for target in (1, d1):
    d0.release_cached_memory()
    d1.release_cached_memory()
    testing.fail_allocations(device=target, nth=1)
    with d0.allocate(1 << 20):
        pass
    try:
        d1.allocate(1 << 20)
    except cc.OutOfMemoryError as e:
        print("device", e.device, e.cause)
    with d1.allocate(1 << 20):
        pass
print("pending", testing.clear_faults())
"""
    r = run_python(code, TWO_DEVICES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["device 1 injected", "device 1 injected", "pending 0"]


def test_the_function_and_the_fixture_take_the_same_keyword_arguments() -> None:
    fn = inspect.signature(testing.fail_allocations)
    method = inspect.signature(FaultInjector.fail_allocations)
    assert list(fn.parameters.values()) == list(method.parameters.values())[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in fn.parameters.values())
    with pytest.raises(TypeError):
        testing.fail_allocations(0, 1)  # type: ignore[misc]


@pytest.mark.sim
def test_a_device_or_an_ordinal_everywhere(dev: cc.Device) -> None:
    assert testing.set_memory_conditions(dev, {}) == 0
    assert testing.set_memory_conditions(0, {}) == 0
    testing.inject_fault("cuMemAlloc_v2", 1_000_000, device=dev)
    testing.fail_allocations(device=dev, nth=1_000_000)
    assert testing.clear_faults() == 3
    with pytest.raises(cc.InvalidValueError, match=r"fail_allocations\(\): device must be >= 0, got -1"):
        testing.fail_allocations(device=-1)
    with pytest.raises(cc.InvalidValueError, match="device 7"):
        testing.inject_fault("cuMemAlloc_v2", device=7)
    with pytest.raises(TypeError, match="device ordinal must be an int, not str"):
        testing.set_memory_conditions("0", {})  # type: ignore[arg-type]


@pytest.mark.sim
def test_an_injected_out_of_memory_says_it_was_injected(dev: cc.Device) -> None:
    dev.release_cached_memory()
    testing.fail_allocations(nth=1)
    with pytest.raises(cc.OutOfMemoryError) as ei:
        dev.allocate(1 << 20)
    e = ei.value
    assert e.cause == "injected"
    assert e.fields["cause_without_fault"] == "pool_reservation"
    assert str(e).startswith("injected by cudacore.testing: out of memory allocating 1.0 MiB on device 0")
    assert "vGPU" not in str(e)
    # The next failure, not injected, gets the verdict of the device's state.
    with pytest.raises(cc.OutOfMemoryError) as ei:
        dev.allocate(dev.total_memory + 1)
    assert ei.value.cause == "too_large"


def test_a_flight_record_path_in_a_missing_folder_is_refused(tmp_path) -> None:
    missing = tmp_path / "no_such_folder" / "oom.txt"
    with pytest.raises(cc.InvalidValueError, match="its folder .*no_such_folder does not exist"):
        cc.configure_flight_recorder(path=missing)
    with pytest.raises(cc.InvalidValueError, match="it is a folder"):
        cc.configure_flight_recorder(path=tmp_path)
    assert cc.configure_flight_recorder()["path"] is None
    r = run_python("import cudacore\n", {"CUDACORE_BACKEND": "sim", "CUDACORE_FLIGHT_RECORD": str(missing)})
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning: CUDACORE_FLIGHT_RECORD=" in r.stderr and "does not exist" in r.stderr


def test_flight_record_limit_must_not_be_negative() -> None:
    with pytest.raises(cc.InvalidValueError, match=r"flight_record\(\): limit must be >= 0"):
        cc.flight_record(limit=-1)
    assert cc.flight_record(limit=0) == []

"""Device detection, properties, allocation strategy, and bad input."""

from __future__ import annotations

import json
import pickle

import pytest

import cudacore as cc

from conftest import run_python


def test_devices_and_identity() -> None:
    devs = cc.devices()
    assert len(devs) == cc.device_count() >= 1
    assert devs[0] is cc.Device(0)
    assert cc.Device(0) == cc.Device(0)
    assert hash(cc.Device(0)) == hash(cc.Device(0))
    assert pickle.loads(pickle.dumps(cc.Device(0))) is cc.Device(0)


def test_properties_are_consistent() -> None:
    d = cc.Device(0)
    assert isinstance(d.name, str) and d.name
    assert d.uuid.startswith("GPU-") and len(d.uuid) == 40
    assert d.pci_bus_id.count(":") == 2
    major, minor = d.compute_capability
    assert major >= 3 and 0 <= minor <= 9
    assert d.multiprocessor_count > 0
    assert d.total_memory > 0
    free, total = d.memory_info()
    assert 0 < free <= total == d.total_memory
    assert d.allocation_strategy in ("pool", "sync")
    assert d.allocation_strategy_reason.endswith(".")
    if d.memory_pools_supported and not d.tcc_driver:
        assert d.allocation_strategy == "pool"
    assert cc.driver_version() >= (11, 0)
    text = repr(d)
    assert d.name in text and "allocator" in text


@pytest.mark.parametrize("bad", [-1, 10_000])
def test_bad_ordinal_is_invalid_value(bad: int) -> None:
    with pytest.raises(cc.InvalidValueError) as info:
        cc.Device(bad)
    assert isinstance(info.value, ValueError)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["0", 1.5, None, True])
def test_non_int_ordinal_is_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        cc.Device(bad)  # type: ignore[arg-type]


@pytest.mark.sim
def test_default_simulator_is_shaped_like_the_h100() -> None:
    d = cc.Device(0)
    assert cc.backend() == "sim"
    assert d.name == "NVIDIA H100 80GB HBM3"
    assert d.total_memory == 85_017_493_504
    assert d.compute_capability == (9, 0)
    assert d.memory_pools_supported and not d.tcc_driver and d.managed_memory and not d.integrated
    assert d.allocation_strategy == "pool"
    d.release_cached_memory()  # what earlier tests left in the pool's reserve
    assert d.memory_info()[0] == 84_465_090_560
    assert cc.driver_version() == (13, 0)


@pytest.mark.gpu
def test_real_device_reports_pool_strategy() -> None:
    d = cc.Device(0)
    assert cc.backend() == "cuda"
    assert d.memory_pools_supported and not d.tcc_driver
    assert d.allocation_strategy == "pool"


PROBE = (
    "import json, cudacore as cc\n"
    "out = []\n"
    "for d in cc.devices():\n"
    "    out.append([d.name, d.allocation_strategy, d.allocation_strategy_reason, d.total_memory])\n"
    "print(json.dumps(out))\n"
)


def test_simulated_tcc_and_no_mempool_devices_fall_back_to_sync() -> None:
    devices = [
        {"name": "sim-tcc", "total_memory": 1 << 30, "memory_pools_supported": False, "tcc_driver": True},
        {"name": "sim-wsl", "total_memory": 2 << 30, "memory_pools_supported": False},
        {"name": "sim-ok", "total_memory": 4 << 30},
    ]
    r = run_python(PROBE, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": json.dumps(devices)})
    assert r.returncode == 0, r.stderr
    (tcc, wsl, ok) = json.loads(r.stdout)
    assert tcc[:2] == ["sim-tcc", "sync"] and "TCC" in tcc[2] and tcc[3] == 1 << 30
    assert wsl[:2] == ["sim-wsl", "sync"] and "MEMORY_POOLS_SUPPORTED=0" in wsl[2]
    assert ok[:2] == ["sim-ok", "pool"]


def test_allocator_override_by_environment() -> None:
    r = run_python(PROBE, {"CUDACORE_BACKEND": "sim", "CUDACORE_ALLOCATOR": "sync"})
    assert r.returncode == 0, r.stderr
    [[_, strategy, reason, _]] = json.loads(r.stdout)
    assert strategy == "sync" and "requested explicitly" in reason


def test_pool_requested_on_tcc_device_is_not_supported() -> None:
    devices = [{"name": "sim-tcc", "memory_pools_supported": False, "tcc_driver": True}]
    code = "import cudacore as cc\ntry:\n    cc.Device(0)\nexcept cc.NotSupportedError as e:\n    print('NotSupported:', e)\n"
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_ALLOCATOR": "pool", "CUDACORE_SIM_DEVICES": json.dumps(devices)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NotSupported:") and "TCC" in r.stdout


CATCH = (
    "import cudacore as cc\n"
    "try:\n"
    "    cc.Device(0)\n"
    "except cc.CUDAError as e:\n"
    "    print(type(e).__name__, e.name, '|', e)\n"
)


@pytest.mark.parametrize(
    ("env", "cls", "needle"),
    [
        ({"CUDACORE_BACKEND": "quantum"}, "InvalidValueError", "unknown backend"),
        ({"CUDACORE_BACKEND": "cuda", "CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"}, "DriverNotFoundError", "/nonexistent/libcuda.so.1"),
        ({"CUDACORE_BACKEND": "cuda", "CUDACORE_LIBCUDA": "libc.so.6"}, "DriverNotFoundError", "cu"),
        ({"CUDACORE_BACKEND": "cuda", "CUDACORE_LIBCUDA": __file__}, "DriverNotFoundError", "test_device.py"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": "[{"}, "InvalidValueError", "CUDACORE_SIM_DEVICES"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": "[]"}, "InvalidValueError", "CUDACORE_SIM_DEVICES"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": '[{"total_memory": -5}]'}, "InvalidValueError", "CUDACORE_SIM_DEVICES"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": '[{"colour": "red"}]'}, "InvalidValueError", "colour"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_PAGEABLE_DIRECT_MAX": "4M"}, "InvalidValueError", "CUDACORE_PAGEABLE_DIRECT_MAX"),
        ({"CUDACORE_BACKEND": "sim", "CUDACORE_PAGEABLE_DIRECT_MAX": "-1"}, "InvalidValueError", "byte count"),
    ],
)
def test_bad_environment_gives_typed_error_not_crash(env: dict[str, str], cls: str, needle: str) -> None:
    r = run_python(CATCH, env)
    assert r.returncode == 0, f"crashed: {r.returncode}\n{r.stderr}"
    assert r.stdout.startswith(cls + " "), r.stdout + r.stderr
    assert needle in r.stdout


AVAILABILITY = (
    "import cudacore as cc\n"
    "print(cc.is_available(), cc.device_count(), len(cc.devices()))\n"
    "print(cc.unavailable_reason())\n"
    "try:\n"
    "    cc.Device(0)\n"
    "except cc.CUDAError as e:\n"
    "    print(type(e).__name__)\n"
)


@pytest.mark.parametrize(
    ("env", "first", "reason"),
    [
        ({"CUDACORE_BACKEND": "sim"}, "True 1 1", "None"),
        ({"CUDACORE_BACKEND": "cuda", "CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"}, "False 0 0", "DriverNotFoundError"),
    ],
)
def test_without_a_driver_there_are_no_devices(env: dict[str, str], first: str, reason: str) -> None:
    # As torch.cuda.device_count(): no driver means no devices, not an error; the reason stays available,
    # and using a device still says what is wrong.
    r = run_python(AVAILABILITY, env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == first
    assert lines[1].startswith(reason)
    if first.startswith("False"):
        assert "/nonexistent/libcuda.so.1" in lines[1]
        assert lines[2] == "DriverNotFoundError"


def test_using_a_device_without_a_driver_says_how_to_check_first() -> None:
    """Issue 31: devices() is empty without a driver, and current_device() / Device(0) raise
    DriverNotFoundError, typed, once, naming the calls that check without raising."""
    code = (
        "import traceback\n"
        "import cudacore as cc\n"
        "print(cc.devices())\n"
        "for use in (cc.current_device, lambda: cc.Device(0)):\n"
        "    try:\n"
        "        use()\n"
        "    except cc.DriverNotFoundError as e:\n"
        "        print(repr(''.join(traceback.format_exception(e))))\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": "cuda", "CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[]" and len(lines) == 3
    for shown in lines[1:]:
        assert "cudacore.DriverNotFoundError: " in shown and "/nonexistent/libcuda.so.1" in shown
        assert "cudacore.is_available()" in shown and "cudacore.unavailable_reason()" in shown
        assert "RuntimeError" not in shown


def test_a_bad_setting_is_an_error_not_an_absence() -> None:
    code = "import cudacore as cc\nprint(cc.is_available())\nprint(cc.unavailable_reason())\n"
    r = run_python(code, {"CUDACORE_BACKEND": "quantum"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "False"
    assert lines[1].startswith("InvalidValueError") and "unknown backend" in lines[1]
    r = run_python("import cudacore as cc\ncc.device_count()\n", {"CUDACORE_BACKEND": "quantum"})
    assert r.returncode != 0 and "InvalidValueError" in r.stderr

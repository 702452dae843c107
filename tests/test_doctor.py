"""``cudacore doctor`` with the simulator, with no driver, and with bad arguments."""

from __future__ import annotations

import json

from conftest import run_cli


def test_doctor_on_simulator_reports_the_device() -> None:
    r = run_cli(["doctor"], {"CUDACORE_BACKEND": "sim"})
    assert r.returncode == 0, r.stderr
    assert "simulator" in r.stdout
    assert "device 0: NVIDIA H100 80GB HBM3" in r.stdout
    assert "allocation strategy  pool" in r.stdout
    assert "78.7 GiB free of 79.2 GiB" in r.stdout


def test_doctor_json_on_simulated_tcc_device() -> None:
    devices = [{"name": "sim-tcc", "total_memory": 1 << 30, "memory_pools_supported": False, "tcc_driver": True}]
    r = run_cli(["doctor", "--json"], {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": json.dumps(devices)})
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    [dev] = report["devices"]
    assert report["backend"] == "sim"
    assert dev["name"] == "sim-tcc" and dev["tcc_driver"] is True
    assert dev["allocation_strategy"] == "sync"
    assert "TCC" in dev["allocation_strategy_reason"]
    assert dev["free_memory"] <= dev["total_memory"] == 1 << 30


def test_doctor_without_driver_exits_nonzero_and_names_the_simulator() -> None:
    r = run_cli(["doctor"], {"CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 1
    assert "no CUDA driver found" in r.stderr
    assert "CUDACORE_BACKEND=sim cudacore doctor" in r.stderr
    assert "Traceback" not in r.stderr


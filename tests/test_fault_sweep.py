"""The fault sweep (tests/fault_sweep.py) in the suite: a seeded sample of (entry point, position, code) cases.

``CUDACORE_SWEEP_SAMPLE`` (default 120 in-flight cases, plus a tenth as many at start) and
``CUDACORE_SWEEP_SEED`` (default 0) set the sample; the full sweep is ``make fault-sweep``.
"""

from __future__ import annotations

import os
import re
import warnings

import pytest

import cudacore as cc
import fault_sweep
from cudacore import testing

SAMPLE = int(os.environ.get("CUDACORE_SWEEP_SAMPLE", "120"))
SEED = int(os.environ.get("CUDACORE_SWEEP_SEED", "0"))

pytestmark = pytest.mark.sim


def test_entry_points_come_from_the_simulator() -> None:
    eps = fault_sweep.entry_points()
    assert len(eps) == len(set(eps)) >= 60
    assert {"cuInit", "cuMemAllocFromPoolAsync", "cuGraphLaunch", "cuStreamEndCapture", "cuMemHostAlloc"} <= set(eps)
    # Each one is an entry point the simulator accepts a fault for (an unknown one is an InvalidValueError).
    for e in eps:
        testing.inject_fault(e, nth=1_000_000)
    assert testing.clear_faults() == len(eps), "the faults far ahead were all still pending"
    with pytest.raises(cc.InvalidValueError, match="unknown entry point"):
        testing.inject_fault("cuNotAnEntryPoint")


def test_cases_cover_every_entry_point_position_and_code() -> None:
    inflight, start = fault_sweep.cases(full=True, sample=0, seed=0)
    eps = fault_sweep.entry_points()
    assert len(inflight) == len(eps) * len(fault_sweep.POSITIONS) * len(fault_sweep.CODES)
    assert len(start) == len(eps) * len(fault_sweep.START_POSITIONS) * len(fault_sweep.START_CODES)
    assert {c.split(":")[0] for c in inflight} == set(eps)
    assert fault_sweep.STICKY <= set(fault_sweep.CODES)
    a, _ = fault_sweep.cases(full=False, sample=30, seed=5)
    assert a == fault_sweep.cases(full=False, sample=30, seed=5)[0], "a sample is reproducible from its seed"


def test_the_workload_is_clean_without_faults() -> None:
    """Without a fault the workload meets no error and returns to the baseline: so every error and leak of
    a case is the fault's doing."""
    rec = fault_sweep.run_case(cc, None, verbose=True)
    assert rec["violations"] == [] and rec["error_list"] == [], rec


def test_a_case_whose_fault_fires_is_checked() -> None:
    rec = fault_sweep.run_case(cc, "cuMemcpyDtoH_v2:1:CUDA_ERROR_ILLEGAL_ADDRESS", verbose=True)
    assert rec["fired"] and rec["violations"] == [], rec
    assert any(re.search(r"DeviceFaultError: .*cuMemcpyDtoH_v2", e) for e in rec["error_list"]), rec
    rec = fault_sweep.run_case(cc, "cuMemAllocFromPoolAsync:100000:CUDA_ERROR_UNKNOWN")  # far beyond the workload
    assert not rec["fired"] and rec["violations"] == []


def test_sample() -> None:
    inflight, start = fault_sweep.cases(full=False, sample=SAMPLE, seed=SEED)
    summary = fault_sweep.sweep(inflight, start)
    assert summary["cases"] == len(inflight) + len(start)
    failed = [f"- {r['case']}: {r['violations'][0][:1500]}" for r in summary["failed"]]
    assert failed == [], "fault sweep violations (python tests/fault_sweep.py --case ENTRY:N:CODE):\n" + "\n".join(failed)
    assert summary["fired"] > summary["cases"] // 4, f"too few faults were reached: {summary}"
    if summary["known"]:
        warnings.warn(f"cases that met the known bug #8: {summary['known']}", stacklevel=1)


def test_a_leak_or_an_untyped_error_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a buffer the workload forgets, and an error cudacore should never raise."""
    kept = []
    original = fault_sweep.Workload.run

    def leaky(self: fault_sweep.Workload) -> None:
        original(self)
        kept.append(self.cc.Device(0).allocate(4096))
        self.step("a bug", lambda: {}["missing"])

    monkeypatch.setattr(fault_sweep.Workload, "run", leaky)
    rec = fault_sweep.run_case(cc, "cuEventQuery:1:CUDA_ERROR_UNKNOWN")
    for b in kept:
        b.close()
    shared = cc.shared_pool(0)  # the kept buffer was in the workload's shared pool, which could not be undone
    if shared is not None:
        shared.undo()
    assert any("untyped KeyError" in v for v in rec["violations"]), rec
    assert any("in_use is" in v for v in rec["violations"]), rec

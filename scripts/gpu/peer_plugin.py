"""pytest plugin of scripts/gpu/peer_suites.py: loaded into a peer library's own test run.

With ``CUDACORE_PEER_ALLOCATOR=cudacore`` it makes cudacore the library's allocator before any test runs
(CuPy: ``cupy.cuda.set_allocator``; PyTorch: ``use_torch_allocator``; Numba reads
``NUMBA_CUDA_MEMORY_MANAGER``, which the runner sets). With ``own`` it changes nothing.

It writes, to the file named by ``CUDACORE_PEER_LOG``, one line as each test starts (``start <nodeid>``)
and one as it ends (``<outcome> <nodeid>``), flushed at once: when the process dies, the last ``start``
without an end names the test that crashed it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_log: Any = None


def _write(line: str) -> None:
    if _log is not None:
        _log.write(line + "\n")
        _log.flush()
        os.fsync(_log.fileno())


def pytest_configure(config: pytest.Config) -> None:
    global _log
    path = os.environ.get("CUDACORE_PEER_LOG")
    if path:
        _log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole session
    if os.environ.get("CUDACORE_PEER_ALLOCATOR") != "cudacore":
        return
    suite = os.environ.get("CUDACORE_PEER_SUITE", "")
    from cudacore import interop

    if suite == "cupy":
        import cupy

        cupy.cuda.set_allocator(interop.cupy_allocator())
    elif suite == "torch":
        interop.use_torch_allocator()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write(f"start {nodeid}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # One outcome per test: the call's, or the setup's when setup failed or skipped; a failed teardown
    # turns a pass into an error.
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.outcome == "skipped" else report.outcome
        if hasattr(report, "wasxfail") and report.outcome == "passed":
            outcome = "xpassed"
        _write(f"{outcome} {report.nodeid}")
    elif report.when == "teardown" and report.outcome == "failed":
        _write(f"error {report.nodeid}")

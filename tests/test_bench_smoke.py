"""The benchmarks run end to end on the simulator, so that a change of an API they call breaks CI, not the
GPU run where their tables are made (docs/contributing/gpu-testing.md). Their figures mean nothing here; each row of
the table must be there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT


def _bench(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env.update(PYTHONPATH=str(ROOT / "python"), CUDACORE_BACKEND="sim")
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


@pytest.mark.sim
def test_hot_paths_runs_every_row():
    lines = _bench(str(ROOT / "bench" / "hot_paths.py"), "--sim")
    rows = {line[:26].strip() for line in lines[1:]}
    for row in ("graph launch", "graph launch, with s:", "4 KiB pinned H2D async", "64 KiB pageable H2D sync",
                "64 KiB pageable H2D async", "stream query, idle", "stream synchronize, idle", "cold door call"):
        assert row in rows, lines


@pytest.mark.sim
def test_alloc_runs_every_table():
    lines = _bench(str(ROOT / "bench" / "alloc.py"), "--quick", "--no-peers")
    text = "\n".join(lines)
    for heading in ("one thread, us per alloc+free pair", "lanes, 1 MiB", "threads, 1 MiB"):
        assert heading in text, text
    for lane in ("legacy stream", "stream=s", "with s:", "a graph alive"):
        assert f"cudacore, {lane}" in text, text


@pytest.mark.sim
def test_copies_runs_every_row():
    lines = _bench(str(ROOT / "bench" / "copies.py"), "--sim", "--rounds", "1")
    rows = {line[:36].strip() for line in lines[2:]}
    for direction in ("H2D", "D2H"):
        for kind in ("pinned sync", "pinned async", "pageable sync", "pageable async"):
            assert f"{direction} {kind} 64 KiB" in rows, lines


@pytest.mark.sim
def test_one_pool_runs_every_row():
    lines = _bench(str(ROOT / "bench" / "one_pool.py"), "--sim", "--rounds", "2")
    text = "\n".join(lines)
    rows = {line[:30].strip() for line in lines}
    for row in ("cudacore", "stand-in (current pool)"):
        assert row in rows, text
    for library in ("torch", "cupy", "rmm"):
        assert any(line.split()[:1] == [library] and "skipped" in line for line in lines), text
    for part in ("allocation, us per alloc+free pair", "peak reserved of one mixed workload", "cudacore + stand-in",
                 "mixed workload, least over its phases", "out-of-memory verdict (stand-in)"):
        assert part in text, text
    verdict = next(line for line in lines if "out-of-memory verdict" in line)
    assert "pool_max_size" in verdict and "named 100.0%" in verdict, verdict

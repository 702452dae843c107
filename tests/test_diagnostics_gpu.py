"""Diagnostics on a real GPU (issue 14): the out-of-memory verdicts an H100 can produce (another process
holding memory, a limit, exhaustion), the fork warning with the real driver initialised by another library,
and ``doctor --verify``'s probes.

Run on the GPU machine with ``CUDACORE_BACKEND=cuda`` and ``-s``: each test prints the message a user sees
(lines starting ``diag:``), for the issue's closing note. The capture diagnostics and the flight recorder
run on both backends in test_diagnostics.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_cli, run_python

pytestmark = pytest.mark.gpu

GiB = 1 << 30


def test_oom_other_process_holds_memory() -> None:
    import cudacore as cc

    dev = cc.Device(0)
    dev.release_cached_memory()
    free, _ = dev.memory_info()
    hold = int(free * 0.6)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, cudacore as cc
            b = cc.Device(0).allocate({hold})
            print("held", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        want = int(free * 0.6)
        with pytest.raises(cc.OutOfMemoryError) as info:
            dev.allocate(want)
        e = info.value
        print(f"\ndiag: other_processes ({e.fields['others_source']}): {e}")
        assert e.cause == "other_processes", str(e)
        assert e.others is not None and e.others >= hold
        if e.fields["others_source"] == "nvml":  # NVML's pids are the host's: in a container they differ
            assert "Other processes hold" in str(e)
    finally:
        holder.communicate("", timeout=60)
    dev.release_cached_memory()


def test_oom_limit() -> None:
    import cudacore as cc

    dev = cc.Device(0)
    dev.memory_limit = 1 * GiB
    try:
        with dev.allocate(512 << 20), pytest.raises(cc.OutOfMemoryError) as info:
            dev.allocate(768 << 20)
    finally:
        dev.memory_limit = None
    print(f"\ndiag: limit: {info.value}")
    assert info.value.cause == "limit"


def test_oom_exhausted_by_this_process() -> None:
    import cudacore as cc

    dev = cc.Device(0)
    held = []
    try:
        with pytest.raises(cc.OutOfMemoryError) as info:
            for _ in range(200):
                held.append(dev.allocate(4 * GiB))
        e = info.value
    finally:
        for b in held:
            b.close()
        dev.release_cached_memory()
    print(f"\ndiag: exhausted: {e}")
    assert e.cause == "exhausted", str(e)
    assert e.flight_record and e.flight_record[-1]["kind"] == "oom"
    assert sum(1 for x in e.flight_record if x["kind"] == "alloc") >= min(len(held), 200)


def test_oom_too_large() -> None:
    import cudacore as cc

    dev = cc.Device(0)
    with pytest.raises(cc.OutOfMemoryError) as info:
        dev.allocate(dev.total_memory + GiB)
    print(f"\ndiag: too_large: {info.value}")
    assert info.value.cause == "too_large"


@pytest.mark.parametrize("library", ["cudacore", "cupy", "torch"])
def test_fork_after_another_library_initialised_the_driver(library: str) -> None:
    init = {
        "cudacore": "cc.Device(0).allocate(256).close()",
        "cupy": "import cupy; cupy.cuda.runtime.getDeviceCount()",
        "torch": "import torch; torch.cuda.init()",
    }[library]
    if library != "cudacore":
        pytest.importorskip(library)
    r = run_python(textwrap.dedent(f"""
        import os, sys
        import cudacore as cc
        {init}
        pid = os.fork()
        if pid == 0:
            try:
                cc.Device(0).allocate(256)
            except cc.IllegalStateError as e:
                print(e.fields["driver_at_fork"], str(e), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """), env={"CUDACORE_BACKEND": "cuda"})
    assert r.returncode == 0, r.stderr
    print(f"\ndiag: fork after {library}: {r.stdout.strip()}")
    assert r.stdout.startswith("2 "), r.stdout
    assert "already initialised in the parent" in r.stdout


def test_doctor_verify_on_the_gpu() -> None:
    r = run_cli(["doctor", "--verify", "--json"], {"CUDACORE_BACKEND": "cuda"})
    assert r.returncode == 0, r.stderr
    probes = {p["name"]: p for p in json.loads(r.stdout)["devices"][0]["probes"]}
    for name in ("memory pool", "pinned host memory", "managed memory", "stack reservation"):
        assert probes[name]["status"] == "verified", probes[name]
    assert probes["stack reservation"]["value"]["cost_bytes"] > 0
    text = run_cli(["doctor", "--verify"], {"CUDACORE_BACKEND": "cuda"})
    print("\ndiag: doctor --verify\n" + text.stdout)


def test_recorder_bench_smoke() -> None:
    """bench/recorder.py runs (its full table is what the GPU run's bench step prints)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "recorder.py"), "--quick"], capture_output=True, text=True,
                       check=False, env={**os.environ, "CUDACORE_BACKEND": "cuda"})
    assert r.returncode == 0, r.stderr
    print(f"\ndiag: recorder bench ({time.perf_counter() - t0:.1f} s)\n{r.stdout}")

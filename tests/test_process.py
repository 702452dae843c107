"""The GIL policy, threads, and fork/spawn."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from importlib import resources

import pytest

import cudacore as cc
from cudacore._native import core

from conftest import run_python


def test_gil_policy_manifest_matches_declarations() -> None:
    manifest = json.loads(resources.files("cudacore._gopy").joinpath("_gil_policy.json").read_text())
    assert manifest["Noop"] == "hold"
    assert manifest["NoopReleased"] == "release"
    assert manifest["DeviceFreeMemory"] == "hold"
    assert manifest["DeviceProperties"] == "release"
    assert manifest["Allocate"] == "device"  # the synchronous strategy's devices release it
    assert set(manifest.values()) <= {"hold", "release", "device"}


def test_releasing_call_lets_other_threads_run() -> None:
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.01)
        before = ticks
        core.NoopReleased(200)  # sleeps 200 ms in Go with the GIL released
        during = ticks - before
    finally:
        stop.set()
        t.join()
    assert during > 1000, f"the other thread made only {during} steps while Go slept: the GIL was held"


def test_held_calls_work_from_many_new_threads() -> None:
    errors: list[BaseException] = []
    dev = cc.Device(0)

    def work() -> None:
        try:
            for i in range(200):
                assert core.Noop(i) == i
                assert dev.memory_info()[0] > 0
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_forked_child_gets_clear_error_and_never_enters_go() -> None:
    code = (
        "import os, sys, cudacore as cc\n"
        "cc.Device(0)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        cc.Device(0).memory_info()\n"
        "    except cc.CUDAError as e:\n"
        "        ok = e.name == 'CUDACORE_ERROR_FORKED' and 'spawn' in str(e)\n"
        "        os._exit(0 if ok else 3)\n"
        "    os._exit(4)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0"


def test_spawned_children_use_the_device() -> None:
    code = (
        "import multiprocessing as mp, cudacore as cc\n"
        "def work(i):\n"
        "    d = cc.Device(0)\n"
        "    return d.memory_info()[1]\n"
        "if __name__ == '__main__':\n"
        "    cc.Device(0)\n"
        "    with mp.get_context('spawn').Pool(2) as pool:\n"
        "        print(len(set(pool.map(work, range(4)))))\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": os.environ["CUDACORE_BACKEND"]}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"

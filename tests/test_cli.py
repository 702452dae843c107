"""The command line: --version, -h of every command, --json errors, versions, and a closed pipe."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import cudacore as cc
from cudacore.__main__ import main

from conftest import ROOT, run_cli

SIM = {"CUDACORE_BACKEND": "sim"}
NO_DRIVER = {"CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"}


def test_version() -> None:
    r = run_cli(["--version"], NO_DRIVER)  # no driver needed
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"cudacore {cc.__version__}"


def test_help_of_every_command() -> None:
    for args in (["-h"], ["--help"], ["doctor", "-h"], ["doctor", "--help"]):
        r = run_cli(args, NO_DRIVER)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.startswith("usage: cudacore"), args
    assert "--json" in run_cli(["doctor", "-h"]).stdout
    assert "doctor" in run_cli(["-h"]).stdout


def test_usage_errors_exit_2() -> None:
    r = run_cli([], SIM)
    assert r.returncode == 2 and "usage: cudacore" in r.stderr
    r = run_cli(["explode"], SIM)
    assert r.returncode == 2 and "invalid choice: 'explode'" in r.stderr
    r = run_cli(["doctor", "--frobnicate"], SIM)
    assert r.returncode == 2 and "unrecognized arguments: --frobnicate" in r.stderr
    assert "Traceback" not in r.stderr


def test_doctor_reports_versions_and_install_path() -> None:
    r = run_cli(["doctor"], SIM)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"cudacore             {cc.__version__}"
    assert lines[1].startswith(f"python               {platform.python_version()} (")
    assert lines[2] == f"installed at         {Path(cc.__file__).resolve().parent}"
    assert "driver               CUDA 13.0" in lines


def test_doctor_json_has_versions() -> None:
    r = run_cli(["doctor", "--json"], SIM)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    v = report["versions"]
    assert v["cudacore"] == cc.__version__
    assert v["python"] == platform.python_version()
    assert Path(v["install_path"]) == Path(cc.__file__).resolve().parent
    assert report["driver_version"] == "13.0" and report["backend"] == "sim"


def test_doctor_json_without_driver_is_an_error_object() -> None:
    r = run_cli(["doctor", "--json"], NO_DRIVER)
    assert r.returncode == 1
    assert r.stderr == ""
    report = json.loads(r.stdout)
    err = report["error"]
    assert err["type"] == "DriverNotFoundError"
    assert err["name"] == "CUDACORE_ERROR_DRIVER_NOT_FOUND"
    assert err["code"] == -1
    assert "/nonexistent/libcuda.so.1" in err["message"]
    assert "CUDACORE_BACKEND=sim" in err["hint"]
    assert report["versions"]["cudacore"] == cc.__version__


def test_doctor_without_driver_names_versions() -> None:
    r = run_cli(["doctor"], NO_DRIVER)
    assert r.returncode == 1 and r.stdout == ""
    assert f"cudacore {cc.__version__}, Python {platform.python_version()}" in r.stderr
    assert "Traceback" not in r.stderr


def _run_into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI with stdout a pipe whose reader is already gone: every write fails with EPIPE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env.update(SIM)
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "cudacore", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)


def test_closed_pipe_ends_quietly() -> None:
    for args in (["doctor"], ["doctor", "--json"], ["-h"]):
        r = _run_into_closed_pipe(args)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stderr == "", args


def test_piped_to_head_exits_cleanly() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env.update(SIM)
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m cudacore doctor | head -1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"cudacore             {cc.__version__}\n"
    assert r.stderr == ""


class _Broken(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_main_in_process_broken_pipe() -> None:
    assert main(["doctor"], out=_Broken(), err=io.StringIO()) == 0


def test_main_in_process_writes_to_the_given_streams() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["doctor", "--json"], out=out, err=err) == 0
    assert json.loads(out.getvalue())["backend"] == cc.backend()
    assert err.getvalue() == ""


def test_version_matches_the_project() -> None:
    found = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found is not None
    assert cc.__version__ == found.group(1)

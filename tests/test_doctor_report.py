"""``cudacore doctor --verify`` adds its probes to the normal report instead of replacing it, and the
``--json`` report (and its error object) carries a schema version (issue 31)."""

from __future__ import annotations

import json

from conftest import run_cli

SIM = {"CUDACORE_BACKEND": "sim"}


def test_verify_adds_to_the_text_report() -> None:
    plain = run_cli(["doctor"], SIM)
    verified = run_cli(["doctor", "--verify"], SIM)
    assert plain.returncode == 0 and verified.returncode == 0, plain.stderr + verified.stderr
    # Everything the plain report says comes first, unchanged but for the free memory, which the probes'
    # allocations may move between the two runs.
    keep = [ln for ln in plain.stdout.splitlines() if not ln.strip().startswith("memory ")]
    got = [ln for ln in verified.stdout.splitlines() if not ln.strip().startswith("memory ")]
    assert got[: len(keep)] == keep
    rest = "\n".join(got[len(keep) :])
    assert "verification (--verify)" in rest
    assert "memory pool" in rest and "verified" in rest
    assert "allocation strategy" in plain.stdout and "verification" not in plain.stdout


def test_verify_adds_probes_to_the_json_report() -> None:
    plain = json.loads(run_cli(["doctor", "--json"], SIM).stdout)
    verified = json.loads(run_cli(["doctor", "--verify", "--json"], SIM).stdout)
    assert set(verified) == set(plain)
    assert plain["schema_version"] == verified["schema_version"] == 1
    [dev] = verified["devices"]
    assert {k for k in dev if k != "probes"} == set(plain["devices"][0])
    assert "probes" not in plain["devices"][0]
    assert dev["probes"][0]["name"] == "memory pool" and dev["probes"][0]["status"] == "verified"
    assert verified["topology"] == plain["topology"]


def test_json_error_object_has_the_schema_version() -> None:
    r = run_cli(["doctor", "--json"], {"CUDACORE_LIBCUDA": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["schema_version"] == 1 and out["error"]["type"] == "DriverNotFoundError"

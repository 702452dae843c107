"""``cudacore doctor``: a report of the driver and every device, for people and for bug reports."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from . import _verify
from ._device import Device, backend, device_count, driver_version
from ._display import format_bytes
from ._errors import CUDAError, DriverNotFoundError
from ._topology import render_topology, topology


def collect() -> dict[str, Any]:
    """Everything the report shows, as plain data (what ``--json`` prints)."""
    major, minor = driver_version()
    report: dict[str, Any] = {
        "backend": backend(),
        "driver_version": f"{major}.{minor}",
        "libcuda": os.environ.get("CUDACORE_LIBCUDA") or "libcuda.so.1",
        "devices": [],
    }
    for i in range(device_count()):
        d = Device(i)
        free, total = d.memory_info()
        entry = d.properties
        entry["free_memory"] = free
        entry["total_memory"] = total
        try:
            entry["limits"] = d.limits.as_dict()
        except CUDAError as exc:
            entry["limits"] = {"error": str(exc)}
        report["devices"].append(entry)
    report["topology"] = topology()
    return report


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render(report: dict[str, Any], out: TextIO) -> None:
    if report["backend"] == "sim":
        out.write("backend              simulator (CUDACORE_BACKEND=sim): no GPU is used\n")
    else:
        out.write(f"backend              CUDA driver ({report['libcuda']})\n")
    out.write(f"driver               CUDA {report['driver_version']}\n")
    out.write(f"devices              {len(report['devices'])}\n")
    for d in report["devices"]:
        major, minor = d["compute_capability"]
        out.write(f"\ndevice {d['ordinal']}: {d['name']}\n")
        rows = [
            ("uuid", d["uuid"]),
            ("pci bus id", d["pci_bus_id"]),
            ("compute capability", f"{major}.{minor}"),
            ("multiprocessors", str(d["multiprocessor_count"])),
            ("memory", f"{format_bytes(d['free_memory'])} free of {format_bytes(d['total_memory'])}"),
            ("memory pools", _yes(d["memory_pools_supported"])),
            ("tcc driver", _yes(d["tcc_driver"])),
            ("managed memory", _yes(d["managed_memory"])),
            ("integrated", _yes(d["integrated"])),
            ("allocation strategy", d["allocation_strategy"]),
            ("  why", d["allocation_strategy_reason"]),
        ]
        out.writelines(f"  {key:<21}{value}\n" for key, value in rows)
        _render_limits(d.get("limits"), out)
    render_topology(report.get("topology"), out)


def _render_limits(limits: dict[str, Any] | None, out: TextIO) -> None:
    if not limits:
        return
    out.write("  limits\n")
    if "error" in limits:
        out.write(f"    unavailable: {limits['error']}\n")
        return
    for name, value in limits.items():
        if value is None:
            shown = "not supported by this device"
        elif name.endswith("_size") or name == "max_l2_fetch_granularity":
            shown = f"{value:,} bytes" + (f" ({format_bytes(value)})" if value >= 1024 else "")
        else:
            shown = f"{value:,}"
        out.write(f"    {name:<33}{shown}\n")


def main(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    as_json = "--json" in argv
    unknown = [a for a in argv if a not in ("--json", "--verify")]
    if unknown:
        err.write(f"cudacore doctor: unknown argument {unknown[0]!r} (the options are --json and --verify)\n")
        return 2
    if "--verify" in argv:
        return _verify.main(as_json, out, err)
    try:
        report = collect()
    except DriverNotFoundError as exc:
        err.write(
            "cudacore doctor: no CUDA driver found.\n"
            f"  {exc}\n"
            "  Install the NVIDIA driver, or point CUDACORE_LIBCUDA at libcuda.so.1.\n"
            "  To run without a GPU, use the simulator:  CUDACORE_BACKEND=sim cudacore doctor\n"
        )
        return 1
    except CUDAError as exc:
        err.write(f"cudacore doctor: {type(exc).__name__} [{exc.name}]: {exc}\n")
        return 1
    if as_json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        render(report, out)
    return 0

"""``cudacore doctor``: a report of the versions, the driver and every device, for people and for bug reports.

The command's flags are declared in :func:`configure_parser` and acted on in :func:`run`; a new flag goes
in both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any, TextIO

from . import _verify
from ._device import Device, backend, device_count, driver_version
from ._display import format_bytes
from ._errors import CUDAError, DriverNotFoundError
from ._topology import render_topology, topology
from ._version import __version__

DESCRIPTION = (
    "Report the cudacore, Python and driver versions, where cudacore is installed, and every device with "
    "its memory, allocation strategy and limits. Exit status 1 when there is no driver or the driver fails."
)

NO_DRIVER_HINT = (
    "Install the NVIDIA driver, or point CUDACORE_LIBCUDA at libcuda.so.1. "
    "To run without a GPU, use the simulator: CUDACORE_BACKEND=sim cudacore doctor"
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The doctor command's flags."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object; a failure is a JSON object with an 'error' key (exit status 1)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also run tiny real probes of what each device supports (pools, pinned and managed memory, the "
        "heap, stack and printf reservations), after the report; each is claimed, verified or fallback",
    )


#: The version of the ``--json`` report's layout (its ``schema_version`` key, in the error object too):
#: raised when a key is removed or changes meaning; keys may be added within a version.
SCHEMA_VERSION = 1


def versions() -> dict[str, Any]:
    """What a bug report needs first, known without a driver: cudacore's version and install path, Python's."""
    return {
        "cudacore": __version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "install_path": os.path.dirname(os.path.abspath(__file__)),
    }


def collect(verify: bool = False) -> dict[str, Any]:
    """Everything the report shows, as plain data (what ``--json`` prints); with ``verify``, each device
    entry also has its ``probes`` (:func:`cudacore._verify.verify`)."""
    major, minor = driver_version()
    # The probes run first: each must be the first use of what it exercises in this process, before the
    # report's own calls (the sharing checks allocate from pools).
    probes = _verify.verify()["devices"] if verify else []
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "versions": versions(),
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
    if verify:  # the same devices, in the same order
        for entry, checked in zip(report["devices"], probes, strict=True):
            entry["probes"] = checked["probes"]
    return report


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _render_versions(v: dict[str, Any], out: TextIO) -> None:
    out.write(f"cudacore             {v['cudacore']}\n")
    out.write(f"python               {v['python']} ({v['python_implementation']}, {v['platform']})\n")
    out.write(f"installed at         {v['install_path']}\n")


def render(report: dict[str, Any], out: TextIO) -> None:
    """The report for people."""
    _render_versions(report["versions"], out)
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


def error_object(exc: CUDAError) -> dict[str, Any]:
    """What ``--json`` prints when the report cannot be made: the error, with the versions known anyway."""
    entry: dict[str, Any] = {
        "type": type(exc).__name__,
        "name": exc.name,
        "code": exc.code,
        "op": exc.op,
        "message": str(exc),
    }
    if isinstance(exc, DriverNotFoundError):
        entry["hint"] = NO_DRIVER_HINT
    return {"schema_version": SCHEMA_VERSION, "error": entry, "versions": versions()}


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``cudacore doctor`` with the parsed ``args``; returns the exit status."""
    verify = bool(getattr(args, "verify", False))
    try:
        report = collect(verify)
    except CUDAError as exc:
        if args.json:
            json.dump(error_object(exc), out, indent=2)
            out.write("\n")
        elif isinstance(exc, DriverNotFoundError):
            v = versions()
            err.write(
                "cudacore doctor: no CUDA driver found.\n"
                f"  {exc}\n"
                "  Install the NVIDIA driver, or point CUDACORE_LIBCUDA at libcuda.so.1.\n"
                "  To run without a GPU, use the simulator:  CUDACORE_BACKEND=sim cudacore doctor\n"
                f"  (cudacore {v['cudacore']}, Python {v['python']}, installed at {v['install_path']})\n"
            )
        else:
            err.write(f"cudacore doctor: {type(exc).__name__} [{exc.name}]: {exc}\n")
        return 1
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        render(report, out)
        if verify:
            out.write("\nverification (--verify): each capability exercised, not only read\n")
            out.write(_verify.format_verify({"backend": report["backend"], "devices": report["devices"]}) + "\n")
    return 0


"""``cudacore doctor --verify``: tiny real probes of what each device really supports.

Attributes can lie (a vGPU that claims memory pools, a driver that refuses them), so each probe exercises
the capability with a few KiB (``pkg/device/verify.go``) and reports it as ``verified`` (it works),
``fallback`` (claimed, but it failed: cudacore uses something else, named in the reason), ``unsupported``
(not claimed, and it does not work), ``claimed`` (only the claim could be read) or ``not probed``
(cudacore has no API for it yet), each with its reason.
"""

from __future__ import annotations

import json
from typing import Any

from ._api import core
from ._device import backend, device_count
from ._display import format_bytes

__all__ = ["format_verify", "verify"]


def verify(device: int | None = None) -> dict[str, Any]:
    """Run the probes on ``device`` (default: every device) and return ``{"backend", "devices": [{"ordinal",
    "probes": [{"name", "claimed", "status", "reason", "value"}]}]}``."""
    ordinals = range(device_count()) if device is None else [device]
    return {
        "backend": backend(),
        "devices": [{"ordinal": i, "probes": json.loads(core.VerifyDevice(i))} for i in ordinals],
    }


def _claim(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


def format_verify(report: dict[str, Any]) -> str:
    """The report of :func:`verify` as text: one line per probe (name, claim, status), then its reason."""
    lines = []
    if report["backend"] == "sim":
        lines.append("backend: the simulator (CUDACORE_BACKEND=sim): the probes exercise the simulated driver")
    for dev in report["devices"]:
        lines.append(f"device {dev['ordinal']}: {'probe':<26}{'claimed':<9}status")
        for p in dev["probes"]:
            lines.append(f"  {p['name']:<32}{_claim(p['claimed']):<9}{p['status']}")
            reason = p["reason"]
            value = p.get("value") or {}
            if "cost_bytes" in value:
                reason += f" ({format_bytes(value['cost_bytes'])})"
            lines.append(f"      {reason}")
    return "\n".join(lines)



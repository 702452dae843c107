"""Several devices and processes at a glance: which devices reach each other's memory and over what link,
and which ways of sharing memory and events with another process work here. ``cudacore doctor`` shows it;
:func:`topology` returns it as plain data."""

from __future__ import annotations

import json
from typing import Any, TextIO

from ._api import core
from ._device import device_count

__all__ = ["link", "render_topology", "topology"]

#: The ways of sharing, by the key IpcProbe reports them under, and what each is for.
IPC_KINDS = {
    "posix_fd": "exportable pool, file descriptor: SharedBuffer, pool strategy",
    "cuipc_mem": "cuIpcMemHandle: SharedBuffer, sync strategy; Numba IPC",
    "cuipc_event": "cuIpcEventHandle: Event(interprocess=True)",
}


def link(device: int, peer: int) -> dict[str, Any]:
    """The path from ``device`` to ``peer`` (ordinals), as plain data.

    ``access``, ``native_atomics`` and ``performance_rank`` are the driver's peer-to-peer attributes of
    that direction (``cuDeviceGetP2PAttribute``; a lower rank is a faster path). ``kind`` is ``"nvlink"``
    or ``"pcie"`` as NVML tells them apart; ``nvlinks`` is the NVLink's width (its active links; through an
    NVSwitch, ``nvswitch`` is True and the count is the links to the switch); ``pcie`` is where the two
    meet on the PCIe tree in ``nvidia-smi topo`` terms (``"PIX"``, ``"PXB"``, ``"PHB"``, ``"NODE"``,
    ``"SYS"``, ``"board"``). Without NVML, ``kind`` and ``pcie`` are ``""`` and ``nvml`` says why;
    otherwise ``nvml`` is ``"ok"``.

    It opens neither device and makes no call that a stream capture forbids, so it can run while any
    device captures. A device with itself, or an ordinal the driver does not have, is an
    :class:`~cudacore.InvalidValueError`.
    """
    return dict(json.loads(core.LinkProbe(device, peer)))


def topology() -> dict[str, Any]:
    """``{"peer_access": [[bool, ...], ...], "links": [{"devices": [i, j], ...}, ...], "ipc": [{"posix_fd": "ok" | error, ...}, ...]}``.

    ``peer_access[i][j]`` says whether device i can access device j's memory directly (False on the
    diagonal). ``links`` has one entry per pair of devices ``i < j``: :func:`link` of ``i`` to ``j`` with
    ``"devices": [i, j]``. ``ipc[i]`` says, per way of sharing, whether device i can export that way:
    ``"ok"`` or the error. Only exporting is tried, as a process cannot open its own handles; the probe may
    create the device's exportable pool, as the first shareable allocation would.
    """
    n = device_count()
    # The peer matrix is the driver's access attribute of each direction (which agrees with
    # cuDeviceCanAccessPeer), read like the links without opening a device: opening one while another
    # device captures could disturb its capture. The sharing probe refuses during a capture.
    paths = {(i, j): link(i, j) for i in range(n) for j in range(n) if i != j}
    peers = [[i != j and bool(paths[i, j]["access"]) for j in range(n)] for i in range(n)]
    links = [{"devices": [i, j], **paths[i, j]} for i in range(n) for j in range(i + 1, n)]
    ipc = [json.loads(core.IpcProbe(i)) for i in range(n)]
    return {"peer_access": peers, "links": links, "ipc": ipc}


def describe_link(entry: dict[str, Any]) -> str:
    """One line for a person: the kind of link and its width, then the driver's attributes."""
    if entry.get("kind") == "nvlink":
        what = f"NVLink x{entry['nvlinks']}" + (" (through NVSwitch)" if entry.get("nvswitch") else "")
    elif entry.get("kind") == "pcie":
        what = f"PCIe ({entry['pcie']})" if entry.get("pcie") else "PCIe"
    else:
        what = "unknown (no NVML)"
    return (
        f"{what + ';':<30} peer access {'yes' if entry['access'] else 'no'}, native atomics "
        f"{'yes' if entry['native_atomics'] else 'no'}, performance rank {entry['performance_rank']}"
    )


def render_topology(data: dict[str, Any] | None, out: TextIO) -> None:
    """The doctor's lines for :func:`topology`'s data."""
    if not data:
        return
    peers = data["peer_access"]
    out.write("\npeer access (row can access column)\n")
    out.write("         " + "".join(f"{j:>5}" for j in range(len(peers))) + "\n")
    out.writelines(f"  dev {i:<3}" + "".join(f"{'-' if i == j else ('yes' if v else 'no'):>5}" for j, v in enumerate(row)) + "\n" for i, row in enumerate(peers))
    links = data.get("links") or []
    if links:
        out.write("\nlinks between devices\n")
        for entry in links:
            i, j = entry["devices"]
            out.write(f"  dev {i} - dev {j}   {describe_link(entry)}\n")
        reasons = sorted({entry["nvml"] for entry in links if entry.get("nvml") != "ok"})
        out.writelines(f"  NVML: {why}\n" for why in reasons)
    out.write("\nsharing with other processes\n")
    for i, kinds in enumerate(data["ipc"]):
        out.write(f"  device {i}\n")
        for key, what in IPC_KINDS.items():
            state = kinds.get(key, "not probed")
            out.write(f"    {key:<13}{'works' if state == 'ok' else 'no':<7}{what}\n")
            if state != "ok":
                out.write(f"{'':17}{state}\n")

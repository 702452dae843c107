"""Several devices and processes at a glance: which devices reach each other's memory, and which ways of
sharing memory and events with another process work here. ``cudacore doctor`` shows it; :func:`topology`
returns it as plain data."""

from __future__ import annotations

import json
from typing import Any, TextIO

from ._api import core
from ._device import Device, device_count

__all__ = ["render_topology", "topology"]

#: The ways of sharing, by the key IpcProbe reports them under, and what each is for.
IPC_KINDS = {
    "posix_fd": "exportable pool, file descriptor: SharedBuffer, pool strategy",
    "cuipc_mem": "cuIpcMemHandle: SharedBuffer, sync strategy; Numba IPC",
    "cuipc_event": "cuIpcEventHandle: Event(interprocess=True)",
}


def topology() -> dict[str, Any]:
    """``{"peer_access": [[bool, ...], ...], "ipc": [{"posix_fd": "ok" | error, ...}, ...]}``.

    ``peer_access[i][j]`` says whether device i can access device j's memory directly (False on the
    diagonal). ``ipc[i]`` says, per way of sharing, whether device i can export that way: ``"ok"`` or the
    error. Only exporting is tried, as a process cannot open its own handles; the probe may create the
    device's exportable pool, as the first shareable allocation would.
    """
    n = device_count()
    peers = [[i != j and bool(core.CanAccessPeer(i, j)) for j in range(n)] for i in range(n)]
    ipc = [json.loads(core.IpcProbe(Device(i).device_id)) for i in range(n)]
    return {"peer_access": peers, "ipc": ipc}


def render_topology(data: dict[str, Any] | None, out: TextIO) -> None:
    """The doctor's lines for :func:`topology`'s data."""
    if not data:
        return
    peers = data["peer_access"]
    out.write("\npeer access (row can access column)\n")
    out.write("         " + "".join(f"{j:>5}" for j in range(len(peers))) + "\n")
    out.writelines(f"  dev {i:<3}" + "".join(f"{'-' if i == j else ('yes' if v else 'no'):>5}" for j, v in enumerate(row)) + "\n" for i, row in enumerate(peers))
    out.write("\nsharing with other processes\n")
    for i, kinds in enumerate(data["ipc"]):
        out.write(f"  device {i}\n")
        for key, what in IPC_KINDS.items():
            state = kinds.get(key, "not probed")
            out.write(f"    {key:<13}{'works' if state == 'ok' else 'no':<7}{what}\n")
            if state != "ok":
                out.write(f"{'':17}{state}\n")

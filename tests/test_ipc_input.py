"""Shared memory given what it did not make: malformed handle messages, a lease descriptor that is not a
lease, and buffers of shared memory pickled where only their exporter can share them (issue 30, items 20
and 21). Each is a typed cudacore error (or the TypeError of pickling) that says what is right, and
leaves no descriptor behind.

An ImportedBuffer is made in this process by opening a pool handle whose exporter is named as another
live process (the parent): the import path maps the memory for real, as a second process would.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
from collections.abc import Iterator

import pytest

import cudacore as cc

pytestmark = pytest.mark.sim


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    cc.Device(0).release_cached_memory()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _message(meta: object) -> bytes:
    body = json.dumps(meta).encode()
    return struct.pack("<I", len(body)) + body


def _good_meta(**changes: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "kind": "pool",
        "device_id": 0,
        "size": 64,
        "handle": "00",
        "pool_id": "1",
        "exporter": 1,
        "ptr": 4096,
        "has_pool_fd": True,
    }
    meta.update(changes)
    return meta


MALFORMED = {
    "nothing (the peer closed)": None,
    "too short": b"\x01\x02",
    "truncated": struct.pack("<I", 100) + b"{}",
    "not JSON": struct.pack("<I", 3) + b"{x}",
    "not UTF-8": struct.pack("<I", 2) + b"\xff\xfe",
    "a JSON list": _message([1, 2]),
    "missing fields": _message({"kind": "pool"}),
    "a field of the wrong type": _message(_good_meta(size="64")),
    "a bool for an int": _message(_good_meta(device_id=True)),
    "an unknown kind": _message(_good_meta(kind="posix")),
    "descriptors missing": _message(_good_meta()),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_receive_of_a_malformed_message_is_a_typed_error(name: str) -> None:
    payload = MALFORMED[name]
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        if payload is None:
            a.close()
        else:
            # One descriptor comes along (a handle needs two here, or none is read): it must be closed.
            r, w = os.pipe()
            socket.send_fds(a, [payload], [r])
            os.close(r)
            os.close(w)
        before = _open_fds()
        with pytest.raises(cc.InvalidValueError, match=r"IpcHandle\.receive: .*IpcHandle\.send"):
            cc.IpcHandle.receive(b)
        assert _open_fds() <= before, "a descriptor that came with the malformed message was left open"
    finally:
        a.close()
        b.close()


def test_a_good_message_is_still_received() -> None:
    d = cc.Device(0)
    with d.allocate_shareable(64) as sb, sb.export() as h:
        a, b = socket.socketpair(socket.AF_UNIX)
        with a, b:
            h.send(a)
            got = cc.IpcHandle.receive(b)
        assert (got.kind, got.size, got.ptr, got.exporter) == (h.kind, 64, h.ptr, os.getpid())
        got.close()


def _handle_with(h: cc.IpcHandle, *, lease_fd: int, exporter: int | None = None) -> cc.IpcHandle:
    return cc.IpcHandle(
        kind=h.kind,
        device_id=h.device_id,
        size=h.size,
        handle=h.handle,
        pool_id=h.pool_id,
        pool_fd=None if h.pool_fd is None else os.dup(h.pool_fd),
        lease_fd=lease_fd,
        exporter=os.getppid() if exporter is None else exporter,
        ptr=h.ptr,
    )


def test_open_with_a_pipe_as_the_lease_is_a_typed_error() -> None:
    d = cc.Device(0)
    with d.allocate_shareable(64, kind="pool") as sb, sb.export() as h:
        for end in (0, 1):
            fds = os.pipe()
            bad = _handle_with(h, lease_fd=fds[end])
            os.close(fds[1 - end])
            before = _open_fds()
            with pytest.raises(cc.InvalidValueError, match="lease descriptor is not a cudacore lease"):
                bad.open()
            assert _open_fds() == before
            bad.close()
        assert d.memory_stats()["shared_in_use"] == 64


def test_open_with_a_closed_lease_descriptor_is_a_typed_error() -> None:
    d = cc.Device(0)
    with d.allocate_shareable(64, kind="pool") as sb, sb.export() as h:
        unused = max(int(fd) for fd in _open_fds()) + 100
        bad = _handle_with(h, lease_fd=unused)
        with pytest.raises(cc.InvalidValueError, match=f"lease descriptor {unused} is not open"):
            bad.open()
        bad._owner.fds.remove(unused)  # the number was never the handle's to close
        bad.close()


def test_pickling_an_imported_buffer_says_only_its_exporter_shares_it() -> None:
    d = cc.Device(0)
    with d.allocate_shareable(64, kind="pool") as sb, sb.export() as h:
        imported = _handle_with(h, lease_fd=os.dup(h.lease_fd)).open()
        assert isinstance(imported, cc.ImportedBuffer)
        with pytest.raises(TypeError) as info:
            pickle.dumps(imported)
        message = str(info.value)
        assert "allocate_shareable" not in message
        assert "ImportedBuffer cannot be sent on" in message
        assert f"process {os.getppid()}" in message and "SharedBuffer.export()" in message
        imported.close()


def test_pickling_a_view_opened_in_the_exporter_names_the_shared_buffer() -> None:
    d = cc.Device(0)
    with d.allocate_shareable(64) as sb, sb.export() as h:
        view = h.open()
        with pytest.raises(TypeError, match="send the SharedBuffer it views") as info:
            pickle.dumps(view)
        assert "allocate_shareable" not in str(info.value)
        view.close()


def test_pickling_a_plain_buffer_still_advises_allocate_shareable() -> None:
    with cc.Device(0).allocate(64) as b, pytest.raises(TypeError, match="allocate_shareable"):
        pickle.dumps(b)


def test_an_open_refused_gives_the_lease_slot_back_at_once() -> None:
    """Found by the fuzzer's new mix: an import refused by Go (here during a capture) kept its slot in the
    exporter's lease while the caller kept the exception (its traceback holds the owner), so the
    SharedBuffer's close was refused, naming this process, and the memory was lost to the program."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    h = sb.export()
    s = d.create_stream()
    other = _handle_with(h, lease_fd=os.dup(h.lease_fd))
    s.begin_capture("relaxed")
    try:
        with pytest.raises(cc.CaptureError) as info:
            other.open()
    finally:
        s.abort_capture()
    kept = info.value  # the caller still holds the error
    other.close()
    h.close()
    sb.close()  # not refused: no process holds the memory
    assert sb.closed and d.memory_stats()["shared_in_use"] == 0
    del kept
    s.close()


def test_a_shared_buffer_dropped_while_imported_here_is_freed_when_the_import_closes() -> None:
    """Found by the fuzzer's new mix: a SharedBuffer collected while an import in this same process held
    it stayed allocated after that import closed, until some later shareable call (shared_in_use and the
    device's free memory did not come back at the end of the program)."""
    import gc

    d = cc.Device(0)
    sb = d.allocate_shareable(65536, kind="pool")
    h = sb.export()
    imported = _handle_with(h, lease_fd=os.dup(h.lease_fd)).open()
    h.close()
    del sb
    gc.collect()
    assert d.memory_stats()["shared_in_use"] == 65536  # held by the import
    imported.close()
    assert d.memory_stats()["shared_in_use"] == 0

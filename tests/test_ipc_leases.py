"""The lease an importing process keeps mapped (docs/guide/multi-gpu.md, Lifetime): every import of one
export in a process uses one mapping of its lease, which stays mapped once the last import closes and is
let go once the export is closed; each import holds its own slot, so closing one (even twice, as a close
cut short by an interrupt runs again) leaves the other's hold; and an export closed by its exporter, or
whose exporter has exited (a zombie too), is refused with or without the kernel's pidfds.

Imports are made in this process by opening a pool handle whose exporter is named as another live
process (the parent), as tests/test_ipc_input.py does: the import path maps the memory for real. The
exporter's exit needs a second process (a spawned exporter).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator

import pytest

import cudacore as cc
from cudacore import _ipc

from conftest import run_python

pytestmark = pytest.mark.sim


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    _ipc._forget_idle_leases()
    cc.Device(0).release_cached_memory()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _foreign(h: cc.IpcHandle) -> cc.IpcHandle:
    """A copy of ``h`` (with its own descriptors) naming the parent as its exporter: it opens as in a
    second process (the fuzzer's helper, which the sweeps use too)."""
    import fuzz_mix

    return fuzz_mix._foreign(cc, h)


def _lease_of(h: cc.IpcHandle) -> _ipc._Lease | None:
    st = os.fstat(h.lease_fd)
    return _ipc._leases.get((st.st_dev, st.st_ino))


def _read(buf: cc.Buffer) -> bytes:
    out = bytearray(buf.size)
    buf.copy_to(out)
    return bytes(out)


def test_imports_of_one_export_share_one_mapping_of_its_lease_and_close_apart() -> None:
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    sb.copy_from(b"\x07" * 4096)
    h = sb.export()
    first, second = _foreign(h), _foreign(h)
    a = first.open()
    lease = _lease_of(h)
    assert lease is not None and lease.users == {a._own.token}
    fds = _open_fds()
    b = second.open()
    assert _open_fds() == fds, "the second import mapped the lease again"
    assert _lease_of(h) is lease and lease.users == {a._own.token, b._own.token}
    a.close()
    assert lease.users == {b._own.token} and lease.usable()
    assert _read(b) == b"\x07" * 4096
    with pytest.raises(cc.IllegalStateError, match=f"processes \\[{os.getpid()}\\] still hold"):
        sb.close()  # the second import still holds its slot
    b.close()
    assert _lease_of(h) is lease and not lease.users, "the idle lease stays mapped"
    c = first.open()  # opens again through the same mapping
    assert _lease_of(h) is lease and _open_fds() == fds
    c.close()
    for x in (first, second, h):
        x.close()
    sb.close()
    assert sb.closed


def test_a_close_run_again_gives_back_only_its_own_slot() -> None:
    """A close that an interrupt cut short runs its release again: the slot it gave back the first time
    must not be taken for another import's of the same process (slots are named by import)."""
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    h = sb.export()
    first, second = _foreign(h), _foreign(h)
    a, b = first.open(), second.open()
    owner = a._own
    owner._release()
    owner._release()  # run again: frees nothing more
    with pytest.raises(cc.IllegalStateError, match="still hold"):
        sb.close()  # b holds its slot still
    a.close()
    b.close()
    for x in (first, second, h):
        x.close()
    sb.close()
    assert sb.closed


def test_an_export_closed_by_its_exporter_is_refused_where_its_lease_is_still_mapped() -> None:
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    h = sb.export()
    first, later = _foreign(h), _foreign(h)
    first.open().close()
    lease = _lease_of(h)
    assert lease is not None and lease.usable() and not lease.users
    h.close()
    first.close()
    sb.close()  # no import holds it: the exporter frees it and marks the lease closed
    assert lease.usable(), "still mapped here, idle"
    with pytest.raises(cc.IllegalStateError, match="has closed this memory"):
        later.open()
    assert not lease.users
    fds = _open_fds()
    _ipc._forget_idle_leases()  # its export is closed: let go
    assert not lease.usable() and _lease_of(later) is None
    # Its descriptor, the one its mapping keeps (Python's mmap holds a duplicate), its own open file
    # description of the lease (the lock's) and the exporter's pidfd.
    assert len(fds - _open_fds()) == 4
    later.close()


def test_idle_leases_are_let_go_when_their_exports_close_and_beyond_the_bound() -> None:
    d = cc.Device(0)
    fds = _open_fds()
    exports = []
    for _ in range(_ipc._IDLE_LEASES + 3):
        sb = d.allocate_shareable(4096, kind="pool")
        h = sb.export()
        with _foreign(h) as other:
            other.open().close()
        exports.append((sb, h))
    idle = [lease for lease in _ipc._leases.values() if not lease.users]
    assert len(idle) == _ipc._IDLE_LEASES, "the oldest idle leases beyond the bound were let go"
    for sb, h in exports:
        h.close()
        sb.close()
    with d.allocate_shareable(4096, kind="pool") as sb, sb.export() as h, _foreign(h) as other:
        other.open().close()  # maps a new lease: the ones whose exports closed are let go
        assert list(_ipc._leases.values()) == [_lease_of(h)]
    _ipc._forget_idle_leases()
    assert not _ipc._leases
    assert _open_fds() <= fds | {str(fd) for fd in _ipc._pool_fds.values()}


def test_an_open_refused_by_a_bad_lease_forgets_no_other_lease() -> None:
    """A lease descriptor that is not a lease is refused before the idle leases are looked at, so that
    the refusal leaves every descriptor as it was."""
    d = cc.Device(0)
    with d.allocate_shareable(4096, kind="pool") as sb, sb.export() as h:
        with _foreign(h) as other:
            other.open().close()  # an idle lease
        r, w = os.pipe()
        os.close(w)
        bad = _foreign(h)
        os.close(bad.lease_fd)
        os.dup2(r, bad.lease_fd)
        os.close(r)
        before = _open_fds()
        with pytest.raises(cc.InvalidValueError, match="not a cudacore lease"):
            bad.open()
        assert _open_fds() == before
        bad.close()


def test_without_pidfds_an_export_still_opens_and_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel refuses pidfd_open (before Linux 5.3, or a sandbox), each open asks whether the
    exporter runs (a signal and /proc); the rest is the same."""

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    sb.copy_from(b"\x05" * 4096)
    h = sb.export()
    other = _foreign(h)
    buf = other.open()
    lease = _lease_of(h)
    assert lease is not None and lease.exporter_gone is None
    assert _read(buf) == b"\x05" * 4096
    buf.close()
    h.close()
    sb.close()
    with pytest.raises(cc.IllegalStateError, match="has closed this memory"):
        other.open()
    other.close()


EXPORTER_EXITS = """
import multiprocessing as mp, os, sys, time
import cudacore as cc

def exporter(q, go):
    sb = cc.Device(0).allocate_shareable(4096)
    q.put((sb.export(), sb.export()))
    go.wait(60)          # the handles have arrived; exit without closing anything

def state(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]

if __name__ == "__main__":
    if sys.argv[1:] == ["no-pidfd"]:
        def refused(pid, flags=0):
            raise OSError(38, "pidfd_open is not implemented")
        os.pidfd_open = refused
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=exporter, args=(q, go)); p.start()
    first, second = q.get(timeout=60)
    first.open().close()            # the lease is mapped here now, and stays
    go.set()
    while state(p.pid) != b"Z":     # exited, not reaped: a zombie
        time.sleep(0.01)
    for when in ("zombie", "reaped"):
        try:
            second.open()
            print(when, "opened")
        except cc.IllegalStateError as e:
            print(when, "IllegalStateError", "exited" in str(e))
        p.join()
"""


def check_an_exporter_that_exited_is_refused(how: str, backend: str = "sim") -> None:
    """An importer that has the lease mapped (it opened and closed once) is refused once the exporter has
    exited, before and after the exporter is reaped; ``how`` is "pidfd" or "no-pidfd" (pidfd_open made to
    fail as where the kernel has none). Also run on the real driver (tests/test_multi_gpu.py)."""
    code = EXPORTER_EXITS.replace('sys.argv[1:] == ["no-pidfd"]', repr(how == "no-pidfd"))
    env = {"CUDACORE_BACKEND": "sim", "CUDACORE_ALLOCATOR": "pool"} if backend == "sim" else {"CUDACORE_BACKEND": backend}
    r = run_python(textwrap.dedent(code), env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n")[:2] == ["zombie IllegalStateError True", "reaped IllegalStateError True"], r.stdout + r.stderr


@pytest.mark.parametrize("how", ["pidfd", "no-pidfd"])
def test_an_exporter_that_exited_is_refused_zombie_or_reaped(how: str) -> None:
    check_an_exporter_that_exited_is_refused(how)


# -- the lock between processes ---------------------------------------------------------------------

TRY_LOCK = """
import fcntl, os, struct, sys

fd = int(sys.argv[1])
flock = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux
out = []
try:  # a record lock of this process, as the lease took it before
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.lockf(fd, fcntl.LOCK_UN)
    out.append("posix:entered")
except OSError:
    out.append("posix:refused")
own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # a description of this process's own, as a lease takes it
try:
    fcntl.fcntl(own, fcntl.F_OFD_SETLK, flock.pack(fcntl.F_WRLCK, 0, 0, 0, 0))
    out.append("ofd:entered")
except OSError:
    out.append("ofd:refused")
print(" ".join(out))
"""


def _other_process_enters(fd: int) -> str:
    """What a second process gets when it tries, without waiting, to lock the lease file that ``fd`` names:
    each kind of lock, ``entered`` or ``refused``."""
    r = subprocess.run([sys.executable, "-c", TRY_LOCK, str(fd)], pass_fds=[fd], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


REFUSED = "posix:refused ofd:refused"


def _inside_a_section(enter: Callable[[Callable[[], None]], object], while_inside: Callable[[], None]) -> None:
    """Run ``enter(wait)`` on a thread, where ``enter`` calls ``wait`` inside a locked lease section, and
    ``while_inside()`` here while that thread waits there; then let it out."""
    inside, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        inside.set()
        assert leave.wait(60)

    def run() -> None:
        try:
            enter(wait)
        except BaseException as exc:  # noqa: BLE001 - reported by the test once the thread is joined
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert inside.wait(60), errors
        while_inside()
    finally:
        leave.set()
        t.join(60)
    assert not t.is_alive() and not errors, errors


def test_closing_another_descriptor_of_the_lease_keeps_the_exporters_lock() -> None:
    """While a thread is inside a locked section of the exporter's lease, another thread closes an
    IpcHandle (a descriptor of the same file): no other process may enter meanwhile. A POSIX record lock
    belongs to the process and the file, and the close of any descriptor of the file dropped it."""
    d = cc.Device(0)
    with d.allocate_shareable(4096, kind="pool") as sb:
        h = sb.export()
        lease = sb._own.lease
        assert lease is not None
        probe = os.dup(lease.fd)
        try:

            def while_inside() -> None:
                assert _other_process_enters(probe) == REFUSED
                closer = threading.Thread(target=h.close)
                closer.start()
                closer.join(60)
                assert h.fds() == []
                assert _other_process_enters(probe) == REFUSED, "closing a handle dropped the lease's lock"

            _inside_a_section(lambda wait: lease._locked(lambda _: wait(), None), while_inside)
            assert _other_process_enters(probe) == "posix:entered ofd:entered", "the section let its lock go"
        finally:
            os.close(probe)


def test_closing_another_descriptor_of_the_lease_keeps_an_importers_lock() -> None:
    """The same for an importer taking its slot (IpcHandle.open): another import's handle closed by
    another thread meanwhile leaves the exporter unable to mark the export closed under it."""
    d = cc.Device(0)
    with d.allocate_shareable(4096, kind="pool") as sb, sb.export() as h:
        first, second = _foreign(h), _foreign(h)
        first.open().close()  # maps the lease here
        lease = _lease_of(h)
        assert lease is not None
        probe = os.dup(h.lease_fd)
        opened: list[cc.Buffer] = []
        try:

            def enter(wait: Callable[[], None]) -> None:
                def gone() -> bool:  # asked inside take()'s locked section
                    wait()
                    return False

                lease.exporter_gone = gone
                opened.append(first.open())

            def while_inside() -> None:
                closer = threading.Thread(target=second.close)
                closer.start()
                closer.join(60)
                assert _other_process_enters(probe) == REFUSED, "closing a handle dropped the lease's lock"

            _inside_a_section(enter, while_inside)
            assert len(opened) == 1 and lease.users == {opened[0]._own.token}
        finally:
            for buf in opened:
                buf.close()
            first.close()
            os.close(probe)


@pytest.mark.parametrize("why", ["no OFD locks", "no /proc"])
def test_without_its_own_description_a_lease_falls_back_to_the_record_lock(why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel has no OFD locks or the lease file cannot be opened again through /proc, a lease
    locks with a POSIX record lock through its own descriptor: it opens, closes and excludes other
    processes as before, holds one descriptor fewer, and (the fallback's documented limit) a descriptor of
    the file closed by another thread during a section lets another process in."""
    if why == "no OFD locks":
        monkeypatch.setattr(_ipc, "_OFD_LOCKS", False)
    else:
        real_open = os.open

        def no_proc(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
            if str(path).startswith("/proc/self/fd/"):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            return real_open(path, flags, mode, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", no_proc)
    d = cc.Device(0)
    sb = d.allocate_shareable(4096, kind="pool")
    sb.copy_from(b"\x09" * 4096)
    h = sb.export()
    lease = sb._own.lease
    assert lease is not None and lease.fds == [lease.fd], "no description of its own"
    other = _foreign(h)
    buf = other.open()
    assert _read(buf) == b"\x09" * 4096
    imported = _lease_of(h)
    assert imported is not None and len(imported.fds) == 2  # its descriptor and the exporter's pidfd
    probe = os.dup(h.lease_fd)
    try:

        def while_inside() -> None:
            assert _other_process_enters(probe) == REFUSED
            os.close(os.dup(probe))
            assert _other_process_enters(probe) == "posix:entered ofd:entered"

        _inside_a_section(lambda wait: lease._locked(lambda _: wait(), None), while_inside)
    finally:
        os.close(probe)
    with pytest.raises(cc.IllegalStateError, match="still hold"):
        sb.close()
    buf.close()
    other.close()
    h.close()
    sb.close()
    assert sb.closed


def test_a_forked_child_leaves_the_lease_alone() -> None:
    """A forked child shares its parent's open file descriptions, the lease's own one included, and with
    it the parent's lock: its lease calls (an open through the import path, a SharedBuffer's close) raise
    IllegalStateError (CUDACORE_ERROR_FORKED) before they change the page."""
    d = cc.Device(0)
    with d.allocate_shareable(4096, kind="pool") as sb, sb.export() as h:
        other = _foreign(h)
        other.open().close()  # the lease is mapped here, and the child inherits it
        lease = sb._own.lease
        assert lease is not None
        page = bytes(lease._mm)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                out = []
                for what, call in (("open", other.open), ("close", sb.close)):
                    try:
                        call()
                        out.append(f"{what}:returned")
                    except cc.CUDAError as exc:
                        out.append(f"{what}:{exc.name}")
                os.write(w, " ".join(out).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert said == "open:CUDACORE_ERROR_FORKED close:CUDACORE_ERROR_FORKED"
        assert bytes(lease._mm) == page, "the child changed the lease's page"
        assert not sb.closed
        other.close()

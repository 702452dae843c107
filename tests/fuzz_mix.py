"""The ``all`` mix of tests/fuzz.py (issue 30): the features added after the first fuzzer.

``python tests/fuzz.py --mix all`` (or ``CUDACORE_FUZZ_MIX=all`` in a worker's environment) installs
these operations into fuzz.py's tables, on two simulated devices that are peers
(:data:`SIM_DEVICES`). A program then also draws from:

- a second device: buffers and streams there, peer access, peer copies in both directions (synchronous,
  on a stream of either device), and peer copies whose bytes are read back and compared;
- shareable memory: ``allocate_shareable`` of both kinds on either device, writes and reads, ``export``,
  ``IpcHandle.open`` in the exporter (a view), pool handles opened through the import path in this
  process (the handle names another live process, the parent, as its exporter: the memory is mapped as a
  second process maps it), pickling round trips, closes in every order (refused while importers or views
  live) and drops to the collector; and now and then a SharedBuffer pickled into a spawned child process
  that writes it, the parent reading the bytes back;
- managed memory on either device (on device 0 it joins the core program's buffers, so copies, captures
  and graphs use it), with ``prefetch`` and ``advise``;
- ``graphed`` functions of several shapes (plain copies, graph memory freed inside, memory kept, an
  exception, a swallowed capture error, recursion), called several times and reset;
- ``rehearse`` of bodies that capture, escape, raise and allocate;
- the flight recorder: Python stacks on and off, its capacity, reading and formatting it, memory reports;
- a KeyboardInterrupt (a real SIGINT, handled by the handler in place) at a random one of the points
  where the interpreter handles signals (:class:`Tripper`) in a random operation, in the main thread;
  each one delivered is counted.

Threads of a burst draw from these too (not the spawns or interrupts). After each program fuzz.py checks,
besides its own invariants, that device 1's memory, ``shared_in_use``, ``managed_in_use`` of both
devices and the process's open file descriptors are back where they were.
"""

from __future__ import annotations

import contextlib
import dis
import gc
import json
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

#: The environment variable that selects the mix in worker processes.
MIX_ENV = "CUDACORE_FUZZ_MIX"
#: Two simulated H100s that are peers (device 0 as in a plain run).
SIM_DEVICES = json.dumps([{}, {}])

#: Operations of the mix drawn at top level, with their weights.
TOP: dict[str, int] = {
    "alloc1": 5, "close1": 3, "stream1": 2, "close_stream1": 1, "enable_peer": 1, "peer_copy": 5, "peer_check": 2,
    "shared": 4, "shared_write": 3, "shared_read": 2, "export": 3, "open_handle": 3, "import_here": 3,
    "close_import": 2, "close_handle": 2, "close_shared": 3, "drop_shared": 1, "pickle_shared": 1, "shared_check": 2,
    "spawn": 1,
    "managed": 3, "managed_hint": 2,
    "graphed": 4, "rehearse": 3, "recorder": 2, "interrupt": 8,
}  # fmt: skip
#: What a thread of a burst draws from: no child processes, no interrupts (they reach the main thread only).
INNER = {k: v for k, v in TOP.items() if k not in ("spawn", "interrupt")}
#: What an interrupted operation is drawn from: the mix's and the core's (no bursts, no nested interrupts).
#: Not a pickling round trip in one process either: its descriptors travel through multiprocessing's
#: resource sharer, whose handshake an interrupt leaves half done (the next unpickling waits for ever, and
#: the descriptors it had registered stay open): multiprocessing's limit, not cudacore's.
INTERRUPTIBLE_EXCLUDE = ("threads", "interrupt", "spawn", "pickle_shared")
#: The most signal checks an interrupt waits before it fires (an operation that makes fewer is not
#: interrupted).
INTERRUPT_SPAN = 400


@dataclass(eq=False)
class Shared:
    """A SharedBuffer of the program."""

    obj: Any
    size: int
    device: int


@dataclass
class Mix:
    """The mix's part of a program's state (``State.mix``)."""

    dev1: Any
    bufs1: list[Any] = field(default_factory=list)  # fuzz.Buf of device 1
    streams1: list[Any] = field(default_factory=list)
    shared: list[Shared] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)
    imports: list[Any] = field(default_factory=list)  # ImportedBuffers and views opened here
    graphed: list[Any] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)  # Buffers graphed functions returned
    recorder_touched: bool = False


#: Counts of the worker process, reported in each program's record (``mix`` key) and summed by the runner.
COUNTS = {"signals": 0, "interrupted_ops": 0, "spawns": 0, "imports": 0, "peer_copies": 0, "graphed_calls": 0, "rehearsals": 0}


def install(fz: ModuleType) -> None:
    """Add the mix to fuzz.py's tables and operations (``fz`` is the fuzz module itself)."""
    fz.TOP_OPS.update(TOP)
    fz.INNER_OPS.update(INNER)
    fz.NESTED["interrupt"] = lambda rng, depth: [
        fz._op(rng, fz._pick(rng, {k: v for k, v in fz.TOP_OPS.items() if k not in INTERRUPTIBLE_EXCLUDE}), depth + 1)
    ]
    for name in TOP:
        setattr(fz.Ops, "op_" + name, staticmethod(globals()["op_" + name]))
    global fuzz
    fuzz = fz


fuzz: Any = None  # the fuzz module, set by install()


def mix(st: Any) -> Mix:
    m = getattr(st, "mix", None)
    if m is None:
        m = st.mix = Mix(st.cc.Device(1))
    return m


def _pick(st: Any, seq: list[Any], r: int) -> Any:
    return st.pick(seq, r)


def _take(st: Any, seq: list[Any], r: int, keep: Callable[[Any], bool] = lambda _: False) -> Any:
    """Take an item of ``seq`` off the program's books (chosen by ``r``), under the state's lock: None when
    there is none, or when ``keep`` says the item must stay (and it stays)."""
    with st.lock:
        item = st.pick(seq, r)
        if item is None or keep(item):
            return None
        seq.remove(item)
        return item


# -- the second device and peer copies -------------------------------------------------------------------


def _stream1(st: Any, r: int) -> Any:
    m = mix(st)
    with st.lock:
        choices = [None, *m.streams1]
    return choices[r % len(choices)]


def op_alloc1(st: Any, a: int, b: int, *_: Any) -> None:
    m = mix(st)
    s = _stream1(st, b)
    size = fuzz._size(a)
    obj = m.dev1.allocate(size, stream=s)
    with st.lock:
        m.bufs1.append(fuzz.Buf(obj, size, st.key(s), None))


def op_close1(st: Any, a: int, *_: Any) -> None:
    m = mix(st)
    buf = _take(st, m.bufs1, a, keep=lambda _: st.threaded)
    if buf is None:
        return
    # Work of other streams on it is ordered before its free by a synchronize, as a careful caller does.
    m.dev1.synchronize()
    st.dev.synchronize()
    buf.obj.close()


def op_stream1(st: Any, a: int, *_: Any) -> None:
    m = mix(st)
    s = m.dev1.create_stream(non_blocking=bool(a % 2))
    with st.lock:
        m.streams1.append(s)


def op_close_stream1(st: Any, a: int, *_: Any) -> None:
    m = mix(st)
    s = _take(st, m.streams1, a, keep=lambda s: st.threaded or any(b.stream is s for b in m.bufs1))
    if s is None:
        return
    s.close()


def op_enable_peer(st: Any, a: int, *_: Any) -> None:
    m = mix(st)
    if a % 2:
        st.dev.enable_peer_access(m.dev1)
    else:
        m.dev1.enable_peer_access(st.dev)
    if not st.dev.can_access_peer(m.dev1):
        raise fuzz.Violation("the simulated devices 0 and 1 are peers, but can_access_peer says not")


def _peer_stream(st: Any, r: int) -> Any:
    """None, a stream of device 0 or one of device 1 (a peer copy runs on either)."""
    if r % 3 == 0:
        return None
    if r % 3 == 1:
        return st.pick(st.streams, r // 3)
    return _stream1(st, r // 3)


def op_peer_copy(st: Any, a: int, b: int, c: int, d: int, *_: Any) -> None:
    m = mix(st)
    with st.lock:
        one, zero = st.pick(m.bufs1, a), st.pick(st.bufs, b)
    if one is None or zero is None or zero.graph_memory:
        return
    s = _peer_stream(st, c)
    if s is not None and (st.capturing(s) is not None or getattr(s, "capturing", False)):
        return  # a peer copy in a capture is a node the model does not follow
    dst, src = (one, zero) if d % 2 else (zero, one)
    n = min(dst.size, src.size)
    with st.lock:
        dst.shadow = None
    COUNTS["peer_copies"] += 1
    st.cc.device_to_device(dst.obj, src.obj, stream=s, nbytes=n)
    if s is not None:
        with st.lock:
            dst.dirty.add(st.key(s))
            src.dirty.add(st.key(s))


def op_peer_check(st: Any, a: int, b: int, c: int, *_: Any) -> None:
    """A peer copy between two fresh buffers, read back: the bytes must be those written."""
    m = mix(st)
    size = fuzz._size(a)
    data = st.host(size, b)
    forward = bool(c % 2)
    src_dev, dst_dev = (st.dev, m.dev1) if forward else (m.dev1, st.dev)
    s = _peer_stream(st, c // 2)
    if s is not None and (st.capturing(s) is not None or getattr(s, "capturing", False)):
        s = None
    with src_dev.allocate(size) as src, dst_dev.allocate(size) as dst:
        src.copy_from(data)
        COUNTS["peer_copies"] += 1
        st.cc.device_to_device(dst, src, stream=s)
        if s is not None:
            s.synchronize()
        out = bytearray(size)
        dst.copy_to(out)
    if bytes(out) != data:
        raise fuzz.Violation(f"a peer copy of {size} bytes from device {src_dev.device_id} read back other bytes")


# -- shareable memory ------------------------------------------------------------------------------------

#: Per device ordinal, whether its driver exports an exportable pool's blocks (kind "pool"), as warm_up
#: found it: some refuse (cuMemPoolExportPointer answers INVALID_VALUE on the H200 pair), and the programs
#: then share kind "ipc" where they would have asked for "pool".
POOL_SHARES: dict[int, bool] = {}


def _kind(dev: Any, kind: str | None) -> str | None:
    return "ipc" if kind == "pool" and not POOL_SHARES.get(dev.device_id, True) else kind



def op_shared(st: Any, a: int, b: int, c: int, *_: Any) -> None:
    m = mix(st)
    dev = st.dev if c % 3 else m.dev1
    kind = _kind(dev, (None, "pool", "ipc")[b % 3])
    size = fuzz._size(a)
    obj = dev.allocate_shareable(size, kind=kind)
    with st.lock:
        m.shared.append(Shared(obj, size, dev.device_id))


def op_shared_write(st: Any, a: int, b: int, *_: Any) -> None:
    sh = st.pick(mix(st).shared, a)
    if sh is not None:
        sh.obj.copy_from(st.host(sh.size, b))


def op_shared_read(st: Any, a: int, *_: Any) -> None:
    sh = st.pick(mix(st).shared, a)
    if sh is not None:
        sh.obj.copy_to(bytearray(sh.size))


def op_export(st: Any, a: int, *_: Any) -> None:
    m = mix(st)
    sh = st.pick(m.shared, a)
    if sh is not None:
        h = sh.obj.export()
        with st.lock:
            m.handles.append(h)


def op_open_handle(st: Any, a: int, *_: Any) -> None:
    """Open a handle in the exporter itself: a view that keeps the SharedBuffer from closing."""
    m = mix(st)
    h = st.pick(m.handles, a)
    if h is not None:
        v = h.open()
        with st.lock:
            m.imports.append(v)


def _foreign(cc: Any, h: Any) -> Any:
    """A copy of pool handle ``h`` naming the parent process as its exporter: opening it takes the import
    path (the driver's import of the pool and the pointer, a slot in the lease), as a second process does."""
    import os as _os

    from cudacore._errors import closed_error
    from cudacore._owner import Descriptors

    # The duplicates are made and owned in one C-level step (extend over map), as export() makes its own:
    # an interrupt between a dup and its owner would be this helper's leak, not cudacore's (signal_sweep).
    # They are made under the lock the handle's close takes: a thread of a burst may close the handle
    # meanwhile, and its descriptors' numbers may then name other files.
    fds = Descriptors([])
    with h._owner._lock:
        if h._owner.closed:
            raise closed_error("IpcHandle", "cudacore.open_shared")
        fds.fds.extend(map(_os.dup, [h.pool_fd, h.lease_fd]))
    return cc.IpcHandle(
        kind=h.kind,
        device_id=h.device_id,
        size=h.size,
        handle=h.handle,
        pool_id=h.pool_id,
        pool_fd=fds.fds[0],
        lease_fd=fds.fds[1],
        exporter=_os.getppid(),
        ptr=h.ptr,
        owner=fds,
    )


def op_import_here(st: Any, a: int, b: int, *_: Any) -> None:
    m = mix(st)
    with st.lock:
        pools = [h for h in m.handles if h.kind == "pool" and h.fds()]
    if not pools:
        return
    h = pools[a % len(pools)]
    with _foreign(st.cc, h) as other:
        buf = other.open()
    COUNTS["imports"] += 1
    with st.lock:
        m.imports.append(buf)
    if b % 2:
        buf.copy_to(bytearray(buf.size))


def op_close_import(st: Any, a: int, *_: Any) -> None:
    v = _take(st, mix(st).imports, a)
    if v is not None:
        v.close()


def op_close_handle(st: Any, a: int, *_: Any) -> None:
    h = _take(st, mix(st).handles, a)
    if h is not None:
        h.close()


def op_close_shared(st: Any, a: int, *_: Any) -> None:
    """Close a SharedBuffer: refused (IllegalStateError) while views or imports of it live, and then it
    stays the program's."""
    m = mix(st)
    sh = st.pick(m.shared, a)
    if sh is None:
        return
    sh.obj.close()
    with st.lock:
        if sh in m.shared:
            m.shared.remove(sh)


def op_drop_shared(st: Any, a: int, *_: Any) -> None:
    """Drop a SharedBuffer to the collector (freed then, or once the importers here let go)."""
    sh = _take(st, mix(st).shared, a, keep=lambda _: st.threaded)
    if sh is None:
        return
    sh.obj = None


def op_pickle_shared(st: Any, a: int, *_: Any) -> None:
    """A pickling round trip in the exporter: the handle it carries opens as a view of the memory."""
    m = mix(st)
    sh = st.pick(m.shared, a)
    if sh is None:
        return
    v = pickle.loads(pickle.dumps(sh.obj))
    with st.lock:
        m.imports.append(v)


def op_shared_check(st: Any, a: int, b: int, c: int, *_: Any) -> None:
    """Write a fresh SharedBuffer, read it through a handle opened here (import path for pool memory):
    the bytes must be those written; then everything is closed in a random order."""
    cc = st.cc
    m = mix(st)
    dev = st.dev if c % 2 else m.dev1
    size = fuzz._size(a)
    data = st.host(size, b)
    kind = _kind(dev, "pool" if c % 3 else "ipc")
    sb = dev.allocate_shareable(size, kind=kind)
    opened = []
    try:
        sb.copy_from(data)
        with sb.export() as h:
            if kind == "pool" and c % 5:
                with _foreign(cc, h) as other:
                    opened.append(other.open())
                COUNTS["imports"] += 1
            else:
                opened.append(h.open())
        out = bytearray(size)
        opened[0].copy_to(out)
        if bytes(out) != data:
            raise fuzz.Violation(f"{kind} shareable memory of {size} bytes read back through a handle holds other bytes")
        try:
            sb.close()  # refused: opened here
        except cc.IllegalStateError:
            pass
        else:
            raise fuzz.Violation("SharedBuffer.close() freed memory a Buffer opened from its handle still used")
    finally:
        for v in opened:
            v.close()
        sb.close()


def _child_write(buf: Any, value: int) -> None:
    """In the spawned child: the SharedBuffer arrived as an ImportedBuffer; fill it with ``value``."""
    buf.copy_from(bytes([value]) * buf.size)
    buf.close()


def op_spawn(st: Any, a: int, b: int, *_: Any) -> None:
    """A SharedBuffer pickled into a spawned child, which writes it; the parent reads the bytes back."""
    import multiprocessing

    if st.threaded:
        return
    m = mix(st)
    dev = st.dev if a % 2 else m.dev1
    kind = _kind(dev, "pool" if b % 2 else "ipc")
    value = 1 + a % 250
    COUNTS["spawns"] += 1
    with dev.allocate_shareable(4096, kind=kind) as sb:
        sb.copy_from(bytes(4096))
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_child_write, args=(sb, value))
        p.start()
        try:
            p.join(60)
            if p.exitcode != 0:
                raise fuzz.Violation(f"the spawned child that imports {kind} memory exited {p.exitcode}")
        finally:
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        out = bytearray(4096)
        sb.copy_to(out)
        if bytes(out) != bytes([value]) * 4096:
            raise fuzz.Violation(f"{kind} memory written by a spawned child reads back other bytes in the exporter")


# -- managed memory --------------------------------------------------------------------------------------


def op_managed(st: Any, a: int, b: int, *_: Any) -> None:
    size = fuzz._size(a)
    if b % 3:
        if st.any_capture():
            return  # a synchronous allocation during a capture: refused, but may invalidate a relaxed one's model
        obj = st.dev.allocate_managed(size)
        buf = fuzz.Buf(obj, size, fuzz.LEGACY, None, {fuzz.LEGACY})
        with st.lock:
            st.bufs.append(buf)
            st.made.append(buf)
    else:
        m = mix(st)
        obj = m.dev1.allocate_managed(size)
        with st.lock:
            m.bufs1.append(fuzz.Buf(obj, size, fuzz.LEGACY, None))


def op_managed_hint(st: Any, a: int, b: int, c: int, *_: Any) -> None:
    m = mix(st)
    with st.lock:
        managed = [x for x in [*st.bufs, *m.bufs1] if isinstance(x.obj, st.cc.ManagedBuffer)]
    if not managed:
        return
    buf = managed[a % len(managed)]
    to: Any = (st.dev, m.dev1, "cpu", 1)[b % 4]
    if c % 2:
        s = st.pick(st.streams, c // 2) if to is not m.dev1 and to != 1 else _stream1(st, c // 2)
        if s is not None and st.capturing(s) is not None:
            return
        buf.obj.prefetch(to, stream=s)
    else:
        advice = ("read_mostly", "preferred_location", "accessed_by", "unset_read_mostly", "unset_preferred_location", "unset_accessed_by")
        buf.obj.advise(advice[c // 2 % len(advice)], to)


# -- graphed and rehearse --------------------------------------------------------------------------------


def op_graphed(st: Any, a: int, b: int, c: int, d: int, *_: Any) -> None:
    """A graphed function of one of several shapes over two buffers of the program, called 1 to 3 times."""
    cc = st.cc
    m = mix(st)
    s = st.pick(st.streams, a)
    if s is None or st.capturing(s) is not None or getattr(s, "capturing", False):
        return
    with st.lock:
        plain = [x for x in st.bufs if not x.graph_memory and not isinstance(x.obj, cc.ManagedBuffer)]
    if len(plain) < 2:
        return
    dst, src = plain[b % len(plain)], plain[(b // 7) % len(plain)]
    n = min(dst.size, src.size)
    shape = c % 6
    kept = m.kept

    def step(depth: int = 0) -> Any:
        cc.device_to_device(dst.obj, src.obj, stream=s, nbytes=n)
        if shape == 1:
            with st.dev.allocate(n, stream=s) as tmp:  # graph memory freed inside the graph
                cc.device_to_device(tmp, src.obj, stream=s, nbytes=n)
        elif shape == 2:
            out = st.dev.allocate(n, stream=s)  # kept: the wrapper runs eagerly and the caller owns it
            kept.append(out)
            return out
        elif shape == 3 and d % 2:
            raise InterruptedError("the graphed function's own error")
        elif shape == 4:
            with contextlib.suppress(cc.CaptureError):
                st.dev.synchronize()  # refused in the capture, and swallowed: the wrapper falls back
        elif shape == 5 and depth == 0:
            return g(1)  # recursion: part of the outer call
        return None

    g = cc.graphed(step, stream=s, mode=fuzz.MODES[d % 3])
    with st.lock:
        m.graphed.append(g)
        dst.shadow = None
        for x in (dst, src):
            x.dirty.add(s)
    for _ in range(1 + d % 3):
        COUNTS["graphed_calls"] += 1
        res = g()
        if res is not None and res not in kept:
            kept.append(res)
    repr(g)
    if d % 4 == 0:
        g.reset()


def op_rehearse(st: Any, a: int, b: int, c: int, *_: Any) -> None:
    cc = st.cc
    with st.lock:
        plain = [x for x in st.bufs if not x.graph_memory and not isinstance(x.obj, cc.ManagedBuffer)]
    s = st.pick(st.streams, a) if a % 3 else None
    if s is not None and (st.capturing(s) is not None or getattr(s, "capturing", False)):
        return
    if st.any_capture() and s is None:
        return  # rehearse's own stream would capture beside the program's: allowed, but not modelled here
    shape = b % 5
    buf = plain[c % len(plain)] if plain else None

    def body(stream: Any) -> None:
        if buf is not None:
            if shape == 0:
                cc.device_to_device(buf.obj, buf.obj, stream=stream)
            elif shape == 1:
                buf.obj.copy_to(bytearray(buf.size))  # synchronous: escapes or is refused
        if shape == 2:
            raise InterruptedError("the rehearsed body's own error")
        if shape == 3:
            with st.dev.allocate(64, stream=stream):
                pass
        if shape == 4:
            st.dev.synchronize()

    COUNTS["rehearsals"] += 1
    diag = cc.rehearse(body, s, mode=fuzz.MODES[c % 3])
    str(diag)
    if buf is not None:
        with st.lock:
            buf.shadow = None


# -- the flight recorder ---------------------------------------------------------------------------------


def op_recorder(st: Any, a: int, b: int, *_: Any) -> None:
    cc = st.cc
    m = mix(st)
    m.recorder_touched = True
    which = a % 6
    if which == 0:
        cc.configure_flight_recorder(python_stacks=(False, True, 3)[b % 3])
    elif which == 1:
        cc.configure_flight_recorder(capacity=(64, 1024, 4096)[b % 3])
    elif which == 2:
        cc.flight_record(1 + b % 50, device=(None, 0, 1)[b % 3])
    elif which == 3:
        cc.format_flight_record(limit=1 + b % 20)
    elif which == 4:
        cc.memory_summary((st.dev, m.dev1)[b % 2])
    else:
        (st.dev, m.dev1)[b % 2].live_allocations()


# -- interrupts ------------------------------------------------------------------------------------------


def _weak_container_callbacks() -> frozenset[CodeType]:
    """The code of the callbacks by which the weak containers of ``weakref`` drop an entry whose referent
    went away (run by the collector or a reference count's drop, wherever the main thread is)."""
    import weakref

    return frozenset(c()._remove.__code__ for c in (weakref.WeakValueDictionary, weakref.WeakKeyDictionary, weakref.WeakSet))


_FINALIZER_CODE = _weak_container_callbacks()


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a finalizer (``__del__``, a weakref callback): a Ctrl-C there reaches no
    caller (Python prints and drops it), so it is not delivered there. A weak container's callback
    interrupted also keeps its dead entry: every later iteration of the container then passes one more
    signal check, so that a sweep's next position fell inside the entries it had itself left, run after
    run, and the sweep of ``graphed``'s capture (which lists the capture buffers) never ended."""
    while frame is not None:
        if frame.f_code.co_name in ("__del__", "_popen_gone") or frame.f_code in _FINALIZER_CODE:
            return True
        frame = frame.f_back
    return False


#: The instructions after which CPython checks for a pending signal (3.11 and 3.12: the end of a call,
#: a loop's back edge); it also checks at a function's entry (RESUME). A real SIGINT's handler runs at those
#: checks only, so a KeyboardInterrupt can appear nowhere else (not between a ``with`` block's last line
#: and its ``__exit__`` call, which a trace function could make it do).
_CHECKED_AFTER = frozenset(dis.opmap[n] for n in ("CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD") if n in dis.opmap)
_RESUME = dis.opmap.get("RESUME", -1)

#: Each code object's exception table (3.11+), parsed once.
_TABLES: dict[CodeType, list[Any]] = {}


def _handler(code: CodeType, offset: int) -> tuple[int, int, bool] | None:
    """The exception handler that an exception raised at byte ``offset`` of ``code`` goes to (None: it leaves
    the frame)."""
    table = _TABLES.get(code)
    if table is None:
        parse = getattr(dis, "_parse_exception_table", None)
        table = _TABLES[code] = parse(code) if parse is not None and hasattr(code, "co_exceptiontable") else []
    for e in table:
        if e.start <= offset < e.end:
            return (e.target, e.depth, e.lasti)
    return None


class Tripper:
    """A trace function that raises SIGINT at the ``at``-th point where the interpreter would handle it
    (see :data:`_CHECKED_AFTER`), outside finalizers: as a Ctrl-C there is handled, by the handler in
    place. ``seen`` counts those points, ``fired`` says whether the signal was raised."""

    def __init__(self, at: int) -> None:
        self.at, self.seen, self.fired = at, 0, False
        self.where = ""  # the function, file and line where the signal was raised
        self._prev: dict[int, int] = {}  # id(frame) -> the opcode it ran last

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            if self.fired or _in_finalizer(frame):
                return None
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self._prev[id(frame)] = -1
            return self
        if event == "exception":
            # A call that raised: its end is no check (CPython goes to the error path, past the check), so
            # the next instruction, the handler's first, is not a point where a signal is handled. CPython
            # 3.11 also loses a trace function's exception raised there: the frame and its callers' frames
            # stay alive for good, with their locals (an IpcHandle's descriptors, say).
            self._prev[id(frame)] = -1
            return self
        if event == "opcode" and not self.fired:
            code, at = frame.f_code, frame.f_lasti
            op = code.co_code[at]
            prev = self._prev.get(id(frame), -1)
            self._prev[id(frame)] = op
            # CPython handles the signal of a check after a call or a back edge as an exception of the code
            # unit just before the next instruction (the call's last, or the one before a loop's head); this
            # trace function can raise only as one of the next instruction. Where the two have different
            # handlers (a call that ends a ``try`` whose ``finally`` follows, inlined), the position would run
            # the wrong one (the finally skipped), so it is not swept.
            if op == _RESUME or prev in _CHECKED_AFTER and _handler(code, at - 2) == _handler(code, at):
                if self.seen == self.at:
                    self.fired = True
                    self.where = f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"
                    signal.raise_signal(signal.SIGINT)
                self.seen += 1
        return self


def op_interrupt(st: Any, a: int, b: int, c: int, d: int, e: int, f: int, sub: list[list[Any]]) -> None:
    """Run ``sub`` with a SIGINT at its ``a % INTERRUPT_SPAN``-th bytecode (a Ctrl-C there). The program
    goes on as a user's would after catching it: bytes are unknown, and a stream whose capture the
    interrupt left begun (an explicit begin_capture's promise) is taken into the program's captures."""
    if threading.current_thread() is not threading.main_thread() or st.threaded or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    tripper = Tripper(a % INTERRUPT_SPAN)
    interrupted = False
    # --replay's printing is held back while the trace function counts the signal checks: each print is
    # one more check, and the replay would interrupt another point than the run it replays.
    verbose, st.verbose, mark = st.verbose, False, len(st.trace)
    try:
        sys.settrace(tripper)
        try:
            for op in sub:
                st.run(op)
        finally:
            sys.settrace(None)
            st.verbose = verbose
    except KeyboardInterrupt:
        interrupted = True
    if tripper.fired:
        COUNTS["signals"] += 1
        with st.lock:
            st.trace.append(f"  -> {threading.current_thread().name}: SIGINT at {tripper.where}")
    if verbose:
        for line in st.trace[mark:]:
            print(line, file=sys.stderr, flush=True)
    if interrupted:
        COUNTS["interrupted_ops"] += 1
        _after_interrupt(st)


def _after_interrupt(st: Any) -> None:
    with st.lock:
        # A close or drop interrupted after it took its buffer off the books (fuzz.Ops._forget) and before
        # it closed or dropped it: the program still holds the buffer (State.made keeps every one), so it goes
        # back on the books and the program's cleanup closes it. Left off, it would be memory the program
        # itself keeps, reported as in use after the program.
        for buf in st.made:
            if buf.obj is not None and not buf.obj.closed and buf not in st.bufs:
                st.bufs.append(buf)
        for buf in [*st.bufs, *mix(st).bufs1]:
            buf.shadow = None
        streams = list(st.streams)
    for s in streams:
        if s not in st.caps and not s.closed and s.capturing:
            with st.lock:
                st.caps[s] = fuzz.Cap(s, "relaxed", threading.get_ident(), dead=True)


# -- the end of a program --------------------------------------------------------------------------------


def cleanup(st: Any, attempt: Any) -> None:
    """Close what the mix made (before fuzz.py's own cleanup): imports and views before their
    SharedBuffers, graphed functions' graphs before the buffers they use."""
    m = getattr(st, "mix", None)
    if m is None:
        return
    cc = st.cc
    for g in m.graphed:
        attempt("reset graphed", g.reset)
    m.graphed.clear()
    for b in m.kept:
        attempt("close graphed result", b.close)
    m.kept.clear()
    for v in m.imports:
        attempt("close import", v.close)
    m.imports.clear()
    for h in m.handles:
        attempt("close handle", h.close)
    m.handles.clear()
    attempt("synchronize", st.dev.synchronize)
    attempt("synchronize device 1", m.dev1.synchronize)
    for sh in m.shared:
        attempt("close shared", sh.obj.close)
    m.shared.clear()
    for b in m.bufs1:
        attempt("close device 1 buffer", b.obj.close)
    m.bufs1.clear()
    for s in m.streams1:
        attempt("close device 1 stream", s.close)
    m.streams1.clear()
    if m.recorder_touched:
        attempt("recorder back", lambda: cc.configure_flight_recorder(python_stacks=False, capacity=4096))


def snapshot(cc: Any, out: dict[str, Any]) -> None:
    """Add the mix's accounting to fuzz.snapshot's: device 1's memory, shared and managed memory of both
    devices, and the open file descriptors (less those cudacore keeps for the process: the exportable
    pools' descriptors, made at the first export of each device). The leases that imports here keep mapped
    are let go first where their exports are closed, as the next open of another export would."""
    from cudacore import _ipc

    _ipc._forget_idle_leases()

    for ordinal in range(min(cc.device_count(), 2)):
        d = cc.Device(ordinal)
        if ordinal:
            for what, fn in (("synchronize", d.synchronize), ("release_cached_memory", d.release_cached_memory)):
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - the program's violation
                    out["error"] = f"device 1 {what} raised {type(exc).__name__}: {exc}"
        stats = d.memory_stats()
        for k in ("shared_in_use", "managed_in_use", *(("in_use",) if ordinal else ())):
            out[f"device {ordinal} {k}"] = stats[k]
        if ordinal:
            out["device 1 free"] = d.memory_info()[0]
    out["open descriptors"] = len(os.listdir("/proc/self/fd")) - len(_ipc._pool_fds)
    out["objects"]["events"] -= len(_ipc._sync_events)


def warm_up(cc: Any) -> None:
    """Make once what cudacore and multiprocessing keep for the whole process (each device's exportable
    pool and its descriptor, the event an export waits with, the pool the import path imports, the
    resource sharer that pickled descriptors travel through, the resource tracker of spawned processes),
    so that a program's first use of them is not counted as its leak."""
    from multiprocessing import resource_tracker

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        # Started in the background of a shell, which ignores SIGINT for its children: a Ctrl-C is the
        # KeyboardInterrupt that the interrupts of the mix deliver.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for ordinal in range(min(cc.device_count(), 2)):
        d = cc.Device(ordinal)
        try:
            d.allocate_shareable(4096, kind="pool").close()
            POOL_SHARES[ordinal] = True
        except cc.NotSupportedError:
            POOL_SHARES[ordinal] = False
        kinds = ("pool", "ipc") if POOL_SHARES[ordinal] else ("ipc",)
        for kind in kinds:
            with d.allocate_shareable(4096, kind=kind) as sb, sb.export() as h:
                if kind == "pool":
                    # The import path keeps the pool it imported for the process (one per exporting pool).
                    with _foreign(cc, h) as other:
                        other.open().close()
                if kind == kinds[0]:
                    # Pickling a handle outside a process start starts multiprocessing's resource sharer,
                    # whose listening socket stays.
                    pickle.loads(pickle.dumps(sb)).close()
        d.allocate_managed(4096).close()
        # The first out-of-memory verdict asks NVML about other processes, which opens the driver's
        # device files and keeps them (NVML stays initialized): do it here, not in a program.
        try:
            d.allocate(2 * d.total_memory).close()
        except cc.OutOfMemoryError:
            pass
        d.release_cached_memory()
    if cc.device_count() > 1:
        cc.Device(0).enable_peer_access(1)
        cc.Device(1).enable_peer_access(0)
        # The driver opens what peer copies need (descriptors included) on the first one each way and
        # keeps it for the process: make those copies here, on no stream and on a stream of each device.
        for a, b in ((0, 1), (1, 0)):
            src, dst = cc.Device(a), cc.Device(b)
            with src.allocate(4096) as x, dst.allocate(4096) as y:
                cc.device_to_device(y, x)
                for s in (src.create_stream(), dst.create_stream()):
                    cc.device_to_device(y, x, stream=s)
                    s.synchronize()
                    s.close()
    resource_tracker.ensure_running()
    gc.collect()


def environment() -> dict[str, str]:
    """What a worker of the mix needs in its environment."""
    return {MIX_ENV: "all", "CUDACORE_SIM_DEVICES": SIM_DEVICES}


HERE = Path(__file__).resolve().parent

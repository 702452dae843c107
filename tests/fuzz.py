"""A random-program fuzzer of cudacore's public API (issue 11), runnable alone and from tests/test_fuzz.py:

    python tests/fuzz.py --programs 10000 --jobs 2          # a long run; prints one JSON line of counts
    python tests/fuzz.py --replay 1234                      # run one program here, printing every operation
    python tests/fuzz.py --shrink 1234                      # the smallest sub-program that still fails
    python tests/fuzz.py --hunt 104843                      # rerun a racy failure until it fails again

A program is a list of operations drawn from a seed (:func:`generate`): allocations and closes, tiles,
pinned memory, every copy kind (host to device, device to host, device to device; synchronous and on a
stream; from bytes, numpy and pinned memory), streams and events, captures in each mode (explicit
begin/end/abort and the ``with`` block), graph instantiate/launch/upload/update/destroy, DLPack and CUDA
Array Interface views, strategy switches, memory limits, garbage collection, bad arguments, and bursts of
threads that run sub-programs at once over the same objects.

After every program the runner checks (:func:`run_program`):

- every exception an operation raised is typed: a :class:`cudacore.CUDAError` other than
  ``CUDACORE_ERROR_INTERNAL``, or a ``TypeError``/``ValueError``/``BufferError`` cudacore raises for bad
  input; anything else (``RuntimeError``, ``AttributeError``, ``KeyError``, ``SystemError``...) is a violation;
- the bytes read back from a buffer are the bytes the program last wrote there, where the program's
  ordering makes them certain (a graph replay or a use-after-close that writes into another owner shows
  up here);
- once everything is closed: ``in_use``, ``pinned_in_use``, the live streams, events, graphs and captures,
  and the device's free memory are back where they were before the program.

Programs run in worker processes (:func:`main`), many per process; a worker that dies (a crash) or stops
reporting (a hang: faulthandler dumps its threads first) is a violation of the program it was running,
and a new worker carries on with the next seed. Every program is reproducible from its seed, but not the
order in which the threads of its bursts run their operations: so a failing program's whole record (every
violation in full, that order as it ran, the programs its process ran before it, the environment) is
appended to ``fuzz-failures.jsonl`` (``--failures``), and ``--hunt`` reruns it after those programs, with
the threads switching more often, until the failure comes back.

On the real driver (``CUDACORE_BACKEND=cuda``) the same programs run; the misuse that is undefined
behaviour on a GPU (using a view after its owner is closed) is left out, as it is on the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KiB = 1 << 10

#: Operations drawn at top level, with their weights.
TOP_OPS: dict[str, int] = {
    "alloc": 12, "close_buf": 7, "drop_buf": 2, "tiles": 2, "pinned": 4, "close_pinned": 2,
    "h2d": 8, "d2h": 6, "d2d": 6, "verify": 5,
    "stream": 4, "close_stream": 2, "sync_stream": 3, "query_stream": 1,
    "event": 2, "record": 3, "wait_event": 2, "sync_event": 1, "query_event": 1, "elapsed": 1, "close_event": 1,
    "capture": 8, "begin_capture": 3, "end_capture": 3, "abort_capture": 1,
    "instantiate": 1, "launch": 6, "graph_reuse": 3, "upload": 1, "update": 2, "destroy_graph": 2, "graph_info": 1,
    "dlpack": 2, "dlpack_capsule": 1, "cai": 2, "close_view": 1,
    "strategy": 1, "limit": 2, "gc": 2, "release_cache": 1, "stats": 1, "sync_device": 2,
    "bad_input": 3, "threads": 2,
}
#: Operations a thread of a burst draws from (no nested bursts, no strategy switches).
INNER_OPS = {k: v for k, v in TOP_OPS.items() if k not in ("threads", "strategy")}
#: Operations inside a ``with stream.capture()`` block: work on the capturing stream, plus a few that the
#: capture forbids (they must fail typed and leave the stream usable).
CAPTURE_OPS = {"alloc_on": 4, "h2d_on": 4, "d2d_on": 3, "d2h_on": 3, "close_buf": 2, "record": 1, "wait_event": 1,
               "sync_stream": 1, "sync_device": 1, "h2d": 1, "gc": 1, "verify": 1, "fork_on": 2}
#: Operations on a stream joined to a capture (``fork_on``), between its fork and its join.
FORK_OPS = {"alloc_on": 3, "h2d_on": 3, "d2d_on": 3, "d2h_on": 2, "close_buf": 1, "sync_stream": 1}
MODES = ("thread_local", "global", "relaxed")


#: Operations left out of every table (``--without``; the workers read it from the environment): for
#: narrowing down which kind of operation a failure needs.
WITHOUT = frozenset(o for o in os.environ.get("CUDACORE_FUZZ_WITHOUT", "").split(",") if o)
#: Never use the per-thread default stream (``--no-per-thread``; the workers read it from the environment).
NO_PER_THREAD = os.environ.get("CUDACORE_FUZZ_NO_PER_THREAD") == "1"


def _pick(rng: random.Random, table: dict[str, int]) -> str:
    names = [k for k in table if k not in WITHOUT] or list(table)
    return rng.choices(names, weights=[table[k] for k in names])[0]


#: Operations with a body of their own that a mix adds (tests/fuzz_mix.py): name -> the body's generator.
NESTED: dict[str, Callable[[random.Random, int], list[Any]]] = {}


def _op(rng: random.Random, name: str, depth: int) -> list[Any]:
    """One operation: its name and the random numbers it uses (objects are chosen by index, modulo)."""
    args: list[Any] = [rng.randrange(1 << 30) for _ in range(6)]
    if name in NESTED:
        args.append(NESTED[name](rng, depth))
    elif name == "capture":
        args.append([_op(rng, _pick(rng, CAPTURE_OPS), depth + 1) for _ in range(rng.randrange(0, 7))])
    elif name == "fork_on":
        args.append([_op(rng, _pick(rng, FORK_OPS), depth + 1) for _ in range(rng.randrange(0, 4))])
    elif name == "threads":
        n = rng.randrange(2, 5)
        args.append([[_op(rng, _pick(rng, INNER_OPS), depth + 1) for _ in range(rng.randrange(3, 15))] for _ in range(n)])
    return [name, *args]


def generate(seed: int, length: int | None = None) -> list[list[Any]]:
    """The program of ``seed``: a list of operations (JSON-able, so a shrunk one can be saved and replayed)."""
    rng = random.Random(seed)
    n = length if length is not None else rng.randrange(5, 60)
    return [_op(rng, _pick(rng, TOP_OPS), 0) for _ in range(n)]


# -- the state of a running program ----------------------------------------------------------------------

LEGACY = "legacy"


@dataclass(eq=False)
class Buf:
    """A device buffer of the program and what the program knows of its bytes."""

    obj: Any
    size: int
    stream: Any  # the key of the stream it was allocated on (LEGACY for None)
    shadow: bytes | None  # the bytes it must hold, or None when the program cannot know them
    dirty: set[Any] = field(default_factory=set)  # stream keys with work on it not yet synchronized
    views: list[Any] = field(default_factory=list)  # DLPack/CAI views and capsules of it
    graph_memory: bool = False  # allocated on a capturing stream (memory of the graph)
    cap: Cap | None = None  # the capture it was allocated in


@dataclass(eq=False)
class Pinned:
    obj: Any
    size: int
    data: bytes | None  # what it holds (None: a copy's sink); sources are never written after they are filled
    dirty: set[Any] = field(default_factory=set)


@dataclass(eq=False)
class Cap:
    """A capture in progress, begun by an explicit begin_capture on the thread ``owner``."""

    stream: Any
    mode: str
    owner: int
    bufs: list[Any] = field(default_factory=list)  # buffers the captured work writes, pinned buffers it uses
    dead: bool = False  # aborted, failed, or its graph destroyed
    # A buffer of this capture was closed while a capture was in progress: its free waits for the captures
    # to end, and may then come after the graph is destroyed (the known bug #8 again).
    deferred_free: bool = False


@dataclass(eq=False)
class G:
    graph: Any
    writes: list[Buf]  # buffers a launch writes (their bytes become unknown)
    reads_pinned: list[Pinned]
    cap: Cap


class Violation(Exception):
    """A broken invariant: the program fails."""


class State:
    """Every object a program made, shared by its threads; the lock guards the lists, never a cudacore call."""

    def __init__(self, cc: Any, gpu: bool) -> None:
        self.cc = cc
        self.dev = cc.Device(0)
        self.gpu = gpu
        self.lock = threading.RLock()
        self.bufs: list[Buf] = []
        self.made: list[Buf] = []  # every buffer the program ever had (graph memory included)
        self.pinned: list[Pinned] = []
        self.streams: list[Any] = []
        self.events: list[Any] = []
        self.graphs: list[G] = []
        self.caps: dict[Any, Cap] = {}  # stream -> capture it began or joined, not yet ended
        self.event_caps: dict[int, Cap | None] = {}  # id(event) -> the capture it was last recorded in
        self.errors: dict[str, int] = {}
        self.violations: list[str] = []
        # Every operation as it ran, with its thread, and the typed errors: the order the threads took is
        # what a rerun of the seed cannot give back, so a failing program's record carries it.
        self.trace: list[str] = []
        self.threaded = 0  # > 0 while a burst of threads runs: bytes are then unknowable
        self.ops = 0
        # Known bugs whose trigger the program met (see KNOWN_BUGS): a violation then carries their name.
        self.known: set[str] = set()
        self.verbose = False  # print each operation and error (--replay)

    # -- helpers ----------------------------------------------------------------------------------------

    def pick(self, seq: list[Any], r: int) -> Any:
        with self.lock:
            return seq[r % len(seq)] if seq else None

    @property
    def all_bufs(self) -> list[Buf]:
        return self.made

    def pick_data(self, r: int, stream: Any) -> Buf | None:
        """A buffer to copy into or out of on ``stream``. On a GPU, graph memory only inside its own
        capture: outside the graph's launches its address is not backed (an illegal address there)."""
        buf = self.pick(self.bufs, r)
        if buf is not None and self.gpu and buf.graph_memory and (buf.cap is None or self.caps.get(stream) is not buf.cap):
            return None
        return buf

    def stream_arg(self, r: int) -> Any:
        """None (the legacy stream), a stream of the program, or the per-thread default stream."""
        with self.lock:
            choices: list[Any] = [None, *self.streams]
        if r % 13 == 0 and not NO_PER_THREAD:
            return self.cc.Stream.per_thread(self.dev)
        return choices[r % len(choices)]

    @staticmethod
    def key(stream: Any) -> Any:
        return LEGACY if stream is None else stream

    def host(self, size: int, r: int) -> bytes:
        return random.Random(r).randbytes(size)

    def touch(self, stream: Any, bufs: list[Buf], pins: list[Pinned] | None = None) -> bool:
        """Record work on ``stream`` over ``bufs``; returns whether the program still knows their bytes.

        Work on one stream is ordered; work on another stream that is not synchronized yet may run before or
        after, so then every buffer involved, and every buffer with work pending there, becomes unknown.
        """
        k = self.key(stream)
        touched: list[Buf | Pinned] = [*bufs, *(pins or [])]
        with self.lock:
            others = set()
            for t in touched:
                others |= t.dirty - {k}
            # The legacy stream and a blocking stream are different keys here although the legacy stream
            # waits for blocking streams: counting them as unordered only loses certainty, never gains it.
            certain = not others and not self.threaded
            if not certain:
                for b in self.bufs:
                    if b in bufs or b.dirty & others:
                        b.shadow = None
            for t in touched:
                t.dirty.add(k)
            return certain

    def synced(self, stream: Any) -> None:
        k = self.key(stream)
        with self.lock:
            every: list[Buf | Pinned] = [*self.bufs, *self.pinned]
            for t in every:
                t.dirty.discard(k)

    def synced_all(self) -> None:
        with self.lock:
            every: list[Buf | Pinned] = [*self.bufs, *self.pinned]
            for t in every:
                t.dirty.clear()

    def note(self, exc: BaseException) -> None:
        name = getattr(exc, "name", None) or type(exc).__name__
        with self.lock:
            self.errors[name] = self.errors.get(name, 0) + 1
            self.trace.append(f"  -> {threading.current_thread().name}: {type(exc).__name__}: {str(exc)[:300]}")
            if self.verbose:
                print(f"  -> {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def run(self, op: list[Any], stream: Any = None) -> None:
        """Run one operation: a typed error is counted (the program goes on), anything else is a violation."""
        name, *args = op
        fn = getattr(Ops, "op_" + name)
        with self.lock:
            self.ops += 1
            self.trace.append(f"{threading.current_thread().name}: {name} {args[:6]}")
            if self.verbose:
                print(self.trace[-1], file=sys.stderr, flush=True)
        try:
            if stream is not None and name.endswith("_on"):
                fn(self, *args, stream=stream)
            else:
                fn(self, *args)
        except Violation:
            raise
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if not typed(self.cc, exc):
                raise Violation(f"{name}: untyped {type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}") from exc
            self.note(exc)

    def drop_cap(self, cap: Cap) -> None:
        """Forget cap's streams, the one that began it and those joined to it: the capture has ended."""
        with self.lock:
            for s in [s for s, c in self.caps.items() if c is cap]:
                del self.caps[s]

    def capturing(self, stream: Any) -> Cap | None:
        with self.lock:
            return self.caps.get(stream) if stream is not None else None

    def any_capture(self) -> bool:
        with self.lock:
            return bool(self.caps)


def typed(cc: Any, exc: BaseException) -> bool:
    """Whether ``exc`` is an error cudacore promises: typed, with a Result (see the module docstring)."""
    if isinstance(exc, cc.CUDAError):
        return exc.name != "CUDACORE_ERROR_INTERNAL"
    return type(exc) in (TypeError, ValueError, BufferError, InterruptedError) or (
        isinstance(exc, (TypeError, ValueError)) and type(exc).__module__.startswith("cudacore")
    )


# -- the operations --------------------------------------------------------------------------------------

SIZES = (1, 7, 64, 256, 4096, 65536, 200_000)


def _size(r: int) -> int:
    return SIZES[r % len(SIZES)] if r % 5 else 1 + r % 100_000


class Ops:
    """The operations: ``op_<name>(st, a, b, c, d, e, f[, sub])``; they raise only what cudacore raises."""

    # memory ----------------------------------------------------------------------------------------------

    @staticmethod
    def op_alloc(st: State, a: int, b: int, *_: Any) -> None:
        s = st.stream_arg(b)
        cap = st.capturing(s)
        size = _size(a)
        obj = st.dev.allocate(size, stream=s)
        buf = Buf(obj, size, st.key(s), None, {st.key(s)}, graph_memory=cap is not None, cap=cap)
        if cap is not None:
            cap.bufs.append(buf)
        with st.lock:
            st.bufs.append(buf)
            st.made.append(buf)

    @staticmethod
    def op_alloc_on(st: State, a: int, b: int, c: int, d: int, e: int, f: int, stream: Any = None) -> None:
        s = stream if stream is not None else st.stream_arg(b)
        cap = st.capturing(s)
        size = _size(a)
        obj = st.dev.allocate(size, stream=s)
        buf = Buf(obj, size, st.key(s), None, {st.key(s)}, graph_memory=cap is not None, cap=cap)
        if cap is not None:
            cap.bufs.append(buf)
        with st.lock:
            st.bufs.append(buf)
            st.made.append(buf)

    @staticmethod
    def _forget(st: State, buf: Buf) -> bool:
        with st.lock:
            if buf not in st.bufs:
                return False
            st.bufs.remove(buf)
            views, buf.views = buf.views, []
        for v in views:  # a view outliving its owner's close is the caller's use-after-free: close it first
            with contextlib.suppress(AttributeError):
                v.close()
        return True

    @staticmethod
    def _settle(st: State, buf: Buf) -> bool:
        """Synchronize the streams other than its own with work on ``buf``, as a correct caller does before
        closing it; False if one cannot be synchronized now (it captures)."""
        for k in list(buf.dirty - {buf.stream}):
            try:
                if k == LEGACY:
                    st.cc.Stream.legacy(st.dev).synchronize()
                else:
                    k.synchronize()
            except st.cc.CUDAError as exc:
                if exc.name == "CUDACORE_ERROR_CLOSED":  # a destroyed stream ran its work before it went
                    continue
                st.note(exc)
                return False
            st.synced(k)
        return True

    @staticmethod
    def op_close_buf(st: State, a: int, *_: Any) -> None:
        buf = st.pick(st.bufs, a)
        # With threads, work on other streams may be issued on it after the check below: on a GPU that
        # would be the program's own use-after-free.
        if buf is None or st.threaded and (st.gpu or buf.dirty - {buf.stream}):
            return
        if not Ops._settle(st, buf) or not Ops._forget(st, buf):
            return
        Ops._close(st, buf)

    @staticmethod
    def _close(st: State, buf: Buf) -> None:
        if buf.cap is not None and buf.cap.dead:
            st.known.add("#8")
        if buf.cap is not None and st.any_capture():
            buf.cap.deferred_free = True
        try:
            buf.obj.close()
        except BufferError:
            # The documented refusal while a DLPack export lives: another thread of a burst made one after
            # _forget closed the views. The buffer goes back to the program, which closes it at the end.
            with st.lock:
                st.bufs.append(buf)
            raise
        except Exception as exc:
            raise Violation(f"closing a live {buf.size}-byte buffer raised {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def op_drop_buf(st: State, a: int, *_: Any) -> None:
        buf = st.pick(st.bufs, a)
        if buf is None or st.threaded or not Ops._settle(st, buf) or not Ops._forget(st, buf):
            return
        if buf.cap is not None and buf.cap.dead:
            st.known.add("#8")
        if buf.cap is not None and st.any_capture():
            buf.cap.deferred_free = True
        buf.obj = None  # collected now (a reference count of zero) or at the next gc

    @staticmethod
    def op_tiles(st: State, a: int, b: int, c: int, *_: Any) -> None:
        s = st.stream_arg(c)
        count, size = 1 + a % 16, _size(b)
        if st.capturing(s) is not None:
            return  # tiles on a capturing stream are graph memory the model does not follow
        tiles = st.dev.allocate_tiles(count, size, stream=s)
        with st.lock:
            st.bufs.extend(Buf(t, size, st.key(s), None, {st.key(s)}) for t in tiles)

    @staticmethod
    def op_pinned(st: State, a: int, b: int, *_: Any) -> None:
        size = _size(a)
        p = st.dev.allocate_pinned(size)
        data = st.host(size, b)
        memoryview(p)[:] = data
        with st.lock:
            st.pinned.append(Pinned(p, size, data))

    @staticmethod
    def op_close_pinned(st: State, a: int, *_: Any) -> None:
        p = st.pick(st.pinned, a)
        if p is None or st.threaded:
            return
        # A graph that copies to or from it keeps it alive (its free waits for the graph's destroy): on a
        # GPU a launch after a real free would fault the device, so this checks that promise there too.
        for k in list(p.dirty):
            try:
                if k == LEGACY:
                    st.dev.synchronize()
                else:
                    k.synchronize()
            except st.cc.CUDAError as exc:
                if exc.name != "CUDACORE_ERROR_CLOSED":
                    st.note(exc)
                    return
            st.synced(k)
        with st.lock:
            if p not in st.pinned:
                return
            st.pinned.remove(p)
        p.obj.close()

    # copies ----------------------------------------------------------------------------------------------

    @staticmethod
    def op_h2d(st: State, a: int, b: int, c: int, d: int, e: int, f: int, stream: Any = None) -> None:
        s = stream if stream is not None else (st.stream_arg(b) if c % 2 else None)
        buf = st.pick_data(a, s)
        if buf is None:
            return
        cap = st.capturing(s)
        kind = d % 3
        n = buf.size if e % 4 else 1 + e % buf.size
        if kind == 2 and st.pinned:
            p = st.pick(st.pinned, f)
            n = min(n, p.size)
            src: Any = p.obj if n == p.size else memoryview(p.obj)[:n]
            data = p.data[:n] if p.data is not None else None
            pins = [p]
        else:
            p, pins = None, []
            data = st.host(n, f)
            src = data if kind == 0 else __import__("numpy").frombuffer(data, dtype="uint8")
        # n bytes into the start of the buffer: a copy of another size than the buffer's says so (nbytes=).
        # A memoryview of a PinnedBuffer made here is released after the call, also when it raises: a
        # traceback that kept it would keep the PinnedBuffer from closing.
        try:
            if cap is not None:
                if p is None and data is not None:
                    src = data  # pageable: staged at capture time, so the replay writes these bytes again
                buf.obj.copy_from(src, stream=s, nbytes=n)
                with st.lock:
                    cap.bufs += [buf, *pins]
                return
            certain = st.touch(s, [buf], pins)
            try:
                buf.obj.copy_from(src, stream=s, nbytes=n)
            except BaseException:
                with st.lock:
                    buf.shadow = None
                raise
        finally:
            if isinstance(src, memoryview):
                src.release()
        with st.lock:
            if data is None:
                buf.shadow = None
            elif certain and n == buf.size and buf in st.bufs and not st.threaded:
                buf.shadow = data
            elif certain and buf.shadow is not None and not st.threaded:
                buf.shadow = data + buf.shadow[n:]
            else:
                buf.shadow = None

    @staticmethod
    def op_d2h(st: State, a: int, b: int, c: int, d: int, e: int, f: int, stream: Any = None) -> None:
        import numpy as np

        s = stream if stream is not None else (st.stream_arg(b) if c % 2 else None)
        buf = st.pick_data(a, s)
        if buf is None:
            return
        cap = st.capturing(s)
        sink: Any
        if d % 3 == 0:
            sink = bytearray(buf.size)
        elif d % 3 == 1:
            sink = np.empty(buf.size, dtype=np.uint8)
        else:
            # A fresh pinned sink: the copy writes it, and nothing of the program reads it but this op.
            p = st.dev.allocate_pinned(buf.size)
            pin = Pinned(p, buf.size, None)
            with st.lock:
                st.pinned.append(pin)
            sink = p
            if cap is not None:
                buf.obj.copy_to(sink, stream=s)
                with st.lock:
                    cap.bufs.append(pin)  # type: ignore[arg-type]  # kept alive while the capture is open
                return
            st.touch(s, [buf], [pin])
            buf.obj.copy_to(sink, stream=s)
            return
        if cap is not None and s is not None:
            return  # a pageable copy ordered on a capturing stream would be a host node of a dead buffer
        st.touch(s, [buf])
        buf.obj.copy_to(sink, stream=s)

    @staticmethod
    def op_d2d(st: State, a: int, b: int, c: int, d: int, e: int, f: int, stream: Any = None) -> None:
        s = stream if stream is not None else (st.stream_arg(c) if d % 2 else None)
        dst, src = st.pick_data(a, s), st.pick_data(b, s)
        if dst is None or src is None:
            return
        n = min(dst.size, src.size)
        if e % 3 == 0:
            n = 1 + e % n
        cap = st.capturing(s)
        if cap is not None:
            st.cc.device_to_device(dst.obj, src.obj, stream=s, nbytes=n)
            cap.bufs.append(dst)
            return
        certain = st.touch(s, [dst, src])
        known = src.shadow
        try:
            st.cc.device_to_device(dst.obj, src.obj, stream=s, nbytes=n)
        except BaseException:
            with st.lock:
                dst.shadow = None
            raise
        with st.lock:
            if certain and known is not None and dst.shadow is not None and not st.threaded and dst is not src:
                dst.shadow = known[:n] + dst.shadow[n:]
            elif certain and known is not None and n == dst.size and not st.threaded and dst is not src:
                dst.shadow = known[:n]
            elif dst is not src:
                dst.shadow = None

    @staticmethod
    def op_verify(st: State, a: int, *_: Any) -> None:
        """Read back a buffer whose bytes the program knows, and compare."""
        with st.lock:
            known = [b for b in st.bufs if b.shadow is not None and not b.graph_memory]
        if not known or st.threaded:
            return
        buf = known[a % len(known)]
        for k in list(buf.dirty):
            if k == LEGACY:
                continue  # the synchronous copy below is ordered after it
            try:
                k.synchronize()
            except st.cc.CUDAError as exc:
                st.note(exc)
                return
            st.synced(k)
        out = bytearray(buf.size)
        try:
            buf.obj.copy_to(out)
        except st.cc.CUDAError as exc:
            st.note(exc)
            return
        shadow = buf.shadow
        if shadow is not None and len(shadow) != buf.size:
            raise Violation(f"the fuzzer's model of a {buf.size}-byte buffer holds {len(shadow)} bytes")
        if shadow is not None and bytes(out) != shadow:
            first = next(i for i in range(buf.size) if out[i] != shadow[i])
            raise Violation(f"buffer of {buf.size} bytes holds other bytes than the program wrote (first at offset {first})")

    # streams and events ----------------------------------------------------------------------------------

    @staticmethod
    def op_stream(st: State, a: int, b: int, *_: Any) -> None:
        s = st.dev.create_stream(non_blocking=bool(a % 4), priority=-(b % 3))
        with st.lock:
            st.streams.append(s)

    @staticmethod
    def op_close_stream(st: State, a: int, *_: Any) -> None:
        s = st.pick(st.streams, a)
        if s is None or st.threaded:
            return
        with st.lock:
            if any(b.stream is s for b in st.bufs):
                return  # buffers ordered on it free on it; cudacore refuses nothing here, but keep them honest
            st.streams.remove(s)
            cap = st.caps.pop(s, None)
        s.close()
        if cap is not None and cap.stream is s:  # closing a joined stream leaves its capture going
            st.drop_cap(cap)
            Ops._dead(st, cap)
            for b in cap.bufs:
                if isinstance(b, Buf):
                    b.shadow = None
        st.synced(s)

    @staticmethod
    def op_sync_stream(st: State, a: int, *_: Any) -> None:
        s = st.pick(st.streams, a)
        if s is None:
            st.cc.Stream.legacy(st.dev).synchronize()
            st.synced(None)
            return
        s.synchronize()
        st.synced(s)

    @staticmethod
    def op_query_stream(st: State, a: int, *_: Any) -> None:
        s = st.pick(st.streams, a)
        if s is not None and s.query():
            st.synced(s)

    @staticmethod
    def op_event(st: State, a: int, *_: Any) -> None:
        e = st.cc.Event(st.dev, timing=bool(a % 2))
        with st.lock:
            st.events.append(e)

    @staticmethod
    def op_record(st: State, a: int, b: int, *_: Any) -> None:
        e = st.pick(st.events, a)
        if e is not None:
            s = st.stream_arg(b)
            e.record(s)
            with st.lock:
                st.event_caps[id(e)] = st.capturing(s)

    @staticmethod
    def op_wait_event(st: State, a: int, b: int, *_: Any) -> None:
        e, s = st.pick(st.events, a), st.pick(st.streams, b)
        if e is not None and s is not None:
            s.wait(e)
            with st.lock:
                cap = st.event_caps.get(id(e))
                joined = cap is not None and s not in st.caps and cap in st.caps.values()
            if joined and s.capturing:  # the event was recorded in a capture in progress: s joined it
                with st.lock:
                    st.caps[s] = cap

    @staticmethod
    def op_sync_event(st: State, a: int, *_: Any) -> None:
        e = st.pick(st.events, a)
        if e is not None:
            e.synchronize()

    @staticmethod
    def op_query_event(st: State, a: int, *_: Any) -> None:
        e = st.pick(st.events, a)
        if e is not None:
            e.query()

    @staticmethod
    def op_elapsed(st: State, a: int, b: int, *_: Any) -> None:
        e1, e2 = st.pick(st.events, a), st.pick(st.events, b)
        if e1 is not None and e2 is not None:
            e1.elapsed_time(e2)

    @staticmethod
    def op_close_event(st: State, a: int, *_: Any) -> None:
        e = st.pick(st.events, a)
        if e is not None and not st.threaded:
            with st.lock:
                if e not in st.events:
                    return
                st.events.remove(e)
            e.close()

    @staticmethod
    def op_sync_device(st: State, *_: Any) -> None:
        st.dev.synchronize()
        st.synced_all()

    # capture and graphs ----------------------------------------------------------------------------------

    @staticmethod
    def op_capture(st: State, a: int, b: int, c: int, d: int, e: int, f: int, sub: list[list[Any]]) -> None:
        s = st.pick(st.streams, a)
        if s is None or st.capturing(s) is not None:
            return
        mode = MODES[b % 3]
        cap = Cap(s, mode, threading.get_ident())
        with st.lock:
            st.caps[s] = cap
        try:
            with s.capture(mode) as graph:
                for op in sub:
                    st.run(op, stream=s)
                if c % 11 == 0:
                    raise InterruptedError("the capture block raised")  # the block's exception discards it
        except BaseException:
            Ops._dead(st, cap)
            if sys.exc_info()[0] is InterruptedError:
                return
            raise
        finally:
            st.drop_cap(cap)
        Ops._adopt_graph(st, graph, cap)

    @staticmethod
    def _adopt_graph(st: State, graph: Any, cap: Cap) -> None:
        writes = [b for b in cap.bufs if isinstance(b, Buf)]
        reads = [p for p in cap.bufs if isinstance(p, Pinned)]
        with st.lock:
            st.graphs.append(G(graph, writes, reads, cap))

    @staticmethod
    def _dead(st: State, cap: Cap) -> None:
        cap.dead = True
        if cap.deferred_free:
            st.known.add("#8")

    @staticmethod
    def op_fork_on(st: State, a: int, b: int, c: int, d: int, e: int, f: int, sub: list[list[Any]], stream: Any = None) -> None:
        """Inside a capture on ``stream``: join another stream to it (fork), work there, and join it back,
        except once in a while, when the capture's end then fails with 904."""
        cap = st.capturing(stream)
        if cap is None:
            return
        with st.lock:
            idle = [s for s in st.streams if s not in st.caps]
        if not idle:
            return
        side = idle[a % len(idle)]
        side.wait(stream.record())
        with st.lock:
            st.caps[side] = cap
        for op in sub:
            st.run(op, stream=side)
        if b % 7:
            stream.wait(side.record())

    @staticmethod
    def op_begin_capture(st: State, a: int, b: int, *_: Any) -> None:
        s = st.pick(st.streams, a)
        if s is None or st.capturing(s) is not None or st.threaded:
            return
        mode = MODES[b % 3]
        s.begin_capture(mode)
        with st.lock:
            st.caps[s] = Cap(s, mode, threading.get_ident())

    @staticmethod
    def _end(st: State, a: int, abort: bool) -> None:
        with st.lock:
            caps = list(st.caps.values())
        if not caps or st.threaded:
            return
        cap = caps[a % len(caps)]
        try:
            if abort:
                Ops._dead(st, cap)
                cap.stream.abort_capture()
            else:
                try:
                    graph = cap.stream.end_capture()
                except BaseException:
                    Ops._dead(st, cap)
                    raise
                Ops._adopt_graph(st, graph, cap)
        finally:
            st.drop_cap(cap)

    @staticmethod
    def op_end_capture(st: State, a: int, *_: Any) -> None:
        Ops._end(st, a, abort=False)

    @staticmethod
    def op_abort_capture(st: State, a: int, *_: Any) -> None:
        Ops._end(st, a, abort=True)

    @staticmethod
    def op_instantiate(st: State, a: int, *_: Any) -> None:
        g = st.pick(st.graphs, a)
        if g is not None:
            g.graph.instantiate()

    @staticmethod
    def op_launch(st: State, a: int, b: int, c: int, *_: Any) -> None:
        g = st.pick(st.graphs, a)
        if g is None:
            return
        s = st.stream_arg(b)
        if st.capturing(s) is not None:
            return  # a launch inside a capture becomes a child graph the model does not follow
        with st.lock:
            for w in g.writes:
                w.shadow = None
                if w not in st.bufs:
                    st.known.add("#6")  # it writes a buffer the program closed
        st.touch(s, g.writes, g.reads_pinned)
        for _launch in range(1 + c % 3):
            g.graph.launch(s)

    @staticmethod
    def op_graph_reuse(st: State, a: int, b: int, c: int, *_: Any) -> None:
        """Close a buffer that a graph writes, let a new buffer of the same size take its place, fill it,
        launch the graph and read the new buffer back: the graph must not write into its new owner (it
        keeps the old buffer alive or refuses the launch)."""
        with st.lock:
            cands = [(g, w) for g in st.graphs for w in g.writes if w in st.bufs and not w.graph_memory]
        if not cands or st.threaded or st.gpu:  # on a GPU the bug would corrupt memory: the sanitizer's job
            return
        g, old = cands[a % len(cands)]
        stream = old.stream if old.stream != LEGACY else None
        if st.capturing(stream) is not None or not Ops._settle(st, old) or not Ops._forget(st, old):
            return
        old_ptr = old.obj.ptr
        Ops._close(st, old)
        new = Buf(st.dev.allocate(old.size, stream=stream), old.size, old.stream, None, {old.stream})
        with st.lock:
            st.bufs.append(new)
        data = st.host(new.size, b)
        new.obj.copy_from(data, stream=stream)
        st.dev.synchronize()
        st.synced_all()
        new.shadow = data
        if new.obj.ptr != old_ptr:
            return  # another address: nothing to see
        st.known.add("#6")
        g.graph.launch(stream)
        st.dev.synchronize()
        out = bytearray(new.size)
        new.obj.copy_to(out)
        if bytes(out) != data:
            raise Violation(f"a graph launch wrote into a {new.size}-byte buffer that took the place of one it had captured (the new buffer holds other bytes than the program wrote)")

    @staticmethod
    def op_upload(st: State, a: int, b: int, *_: Any) -> None:
        g = st.pick(st.graphs, a)
        if g is not None:
            s = st.stream_arg(b)
            if st.capturing(s) is None:
                g.graph.upload(s)

    @staticmethod
    def op_update(st: State, a: int, b: int, *_: Any) -> None:
        g1, g2 = st.pick(st.graphs, a), st.pick(st.graphs, b)
        if g1 is None or g2 is None:
            return
        g1.graph.update(g2.graph)
        with st.lock:  # on success g1 now does g2's work
            g1.writes = [*g1.writes, *g2.writes]
            g1.reads_pinned = [*g1.reads_pinned, *g2.reads_pinned]

    @staticmethod
    def op_destroy_graph(st: State, a: int, *_: Any) -> None:
        g = st.pick(st.graphs, a)
        if g is None or st.threaded:
            return
        g.graph.destroy()
        Ops._dead(st, g.cap)
        with st.lock:
            if g in st.graphs:
                st.graphs.remove(g)

    @staticmethod
    def op_graph_info(st: State, a: int, b: int, *_: Any) -> None:
        g = st.pick(st.graphs, a)
        if g is not None:
            _ = g.graph.node_count, g.graph.memory_held, g.graph.allocations, repr(g.graph)
            fd, path = tempfile.mkstemp(suffix=".dot")
            os.close(fd)
            try:
                g.graph.debug_dot(path, verbose=bool(b & 1))
                with open(path) as f:
                    head = f.read(64)
                if not head.lstrip().startswith("digraph"):
                    raise AssertionError(f"debug_dot wrote {head!r}, not a DOT graph")
            finally:
                os.unlink(path)

    # interop ---------------------------------------------------------------------------------------------

    @staticmethod
    def _viewable(st: State, a: int) -> Buf | None:
        buf = st.pick(st.bufs, a)
        if buf is None or buf.obj is None or buf.obj.closed:
            return None
        return buf

    @staticmethod
    def op_dlpack(st: State, a: int, b: int, *_: Any) -> None:
        from cudacore import interop

        buf = Ops._viewable(st, a)
        if buf is None:
            return
        s = st.pick(st.streams, b) if b % 2 else None
        view = interop.from_dlpack(buf.obj, stream=None if s is None else s.handle)
        with st.lock:
            buf.views.append(view)  # closed when the owner is forgotten
        if b % 5 == 0:
            # The view as a Buffer: a copy from its owner onto itself. Racing work on another stream could
            # see it halfway, so the owner's bytes are unknown from here.
            with st.lock:
                buf.shadow = None
            st.cc.device_to_device(view, buf.obj, stream=None, nbytes=min(view.size, buf.size))

    @staticmethod
    def op_dlpack_capsule(st: State, a: int, b: int, *_: Any) -> None:
        buf = Ops._viewable(st, a)
        if buf is None:
            return
        kwargs: dict[str, Any] = {}
        if b % 2:
            kwargs["max_version"] = (1, 0)
        if b % 3 == 0:
            kwargs["stream"] = -1
        cap = buf.obj.__dlpack__(**kwargs)
        buf.obj.__dlpack_device__()
        if b % 4 == 0:
            del cap  # dropped unconsumed: the capsule's destructor frees the tensor

        else:
            with st.lock:
                buf.views.append(_Held(cap))

    @staticmethod
    def op_cai(st: State, a: int, *_: Any) -> None:
        buf = Ops._viewable(st, a)
        if buf is None:
            return
        view = st.cc.asbuffer(_CAI(buf.obj.__cuda_array_interface__, buf.obj))
        if view.ptr != buf.obj.ptr or view.size != buf.size:
            raise Violation("a CUDA Array Interface view does not cover its buffer")
        with st.lock:
            buf.views.append(view)

    @staticmethod
    def op_close_view(st: State, a: int, *_: Any) -> None:
        buf = st.pick(st.bufs, a)
        if buf is None or not buf.views:
            return
        with st.lock:
            v = buf.views.pop()
        with contextlib.suppress(AttributeError):
            v.close()

    # allocator settings ----------------------------------------------------------------------------------

    @staticmethod
    def op_strategy(st: State, a: int, b: int, *_: Any) -> None:
        strategy = ("auto", "pool", "sync", "auto")[a % 4]
        st.dev.set_allocation_strategy(strategy, track=bool(b % 2))
        if st.dev.allocation_strategy not in ("pool", "sync"):
            raise Violation(f"allocation_strategy is {st.dev.allocation_strategy!r} after switching to {strategy!r}")

    @staticmethod
    def op_limit(st: State, a: int, b: int, *_: Any) -> None:
        if a % 3 == 0:
            st.dev.memory_limit = None
            return
        in_use = st.dev.memory_stats()["in_use"]
        st.dev.memory_limit = max(1, in_use + (b % (1 << 20)) - (1 << 18))

    @staticmethod
    def op_gc(st: State, *_: Any) -> None:
        gc.collect()

    @staticmethod
    def op_release_cache(st: State, a: int, *_: Any) -> None:
        st.dev.release_cached_memory()
        if a % 2:
            st.dev.reset_peak_memory_stats()

    @staticmethod
    def op_stats(st: State, a: int, *_: Any) -> None:
        stats = st.dev.memory_stats()
        st.dev.memory_info()
        st.dev.would_fit(1 + a % 8, _size(a))
        if stats["in_use"] > stats["peak_in_use"] or stats["in_use"] < 0:
            raise Violation(f"memory_stats is inconsistent: {dict(stats)}")
        st.dev.live_allocations()

    # bad input: each must raise a typed error ------------------------------------------------------------

    @staticmethod
    def op_bad_input(st: State, a: int, b: int, *_: Any) -> None:
        cc, dev = st.cc, st.dev
        buf = st.pick(st.bufs, b)
        cases: list[Callable[[], Any]] = [
            lambda: dev.allocate(0),
            lambda: dev.allocate(-5),
            lambda: dev.allocate("64"),  # type: ignore[arg-type]
            lambda: dev.allocate(1 << 62),
            lambda: dev.allocate(64, stream=-3),
            lambda: dev.allocate(64, stream="s"),
            lambda: dev.allocate_tiles(0, 16),
            lambda: dev.allocate_tiles(4, -1),
            lambda: dev.allocate_pinned(0),
            lambda: dev.allocate_pinned(1 << 62),
            lambda: dev.create_stream(priority="1"),  # type: ignore[arg-type]
            lambda: dev.set_allocation_strategy("fast"),
            lambda: setattr(dev, "memory_limit", "1"),
            lambda: cc.Stream(dev).begin_capture("bogus"),
            lambda: cc.Device(10_000),
            lambda: cc.Event(dev).elapsed_time(cc.Event(dev)),
            lambda: cc.Stream.legacy(dev).end_capture(),
        ]
        if buf is not None and buf.obj is not None:
            b_ = buf.obj
            cases += [
                lambda: b_.copy_from(bytes(b_.size + 1)),
                lambda: b_.copy_to(bytearray(b_.size + 1), stream=-1),
                lambda: b_.copy_from("text"),
                lambda: cc.device_to_device(b_, b_, nbytes=b_.size + 1),
                lambda: cc.device_to_device(b_, "x"),  # type: ignore[arg-type]
                lambda: b_.__dlpack__(copy=True),
                lambda: b_.__dlpack__(dl_device=(1, 0)),
                lambda: b_.copy_to(bytes(b_.size)),  # read-only host memory
            ]
        fn = cases[a % len(cases)]
        try:
            fn()
        except BaseException as exc:
            if not typed(cc, exc):
                raise
            st.note(exc)
            return
        # These are all wrong; the few that a backend may accept are listed here.
        if a % len(cases) not in (4,):
            raise Violation(f"bad input case {a % len(cases)} was accepted")

    # threads ---------------------------------------------------------------------------------------------

    @staticmethod
    def op_threads(st: State, a: int, b: int, c: int, d: int, e: int, f: int, subs: list[list[list[Any]]]) -> None:
        errors: list[BaseException] = []
        with st.lock:
            st.threaded += 1
            for b_ in st.bufs:
                b_.shadow = None

        def work(ops: list[list[Any]]) -> None:
            try:
                for op in ops:
                    st.run(op)
            except BaseException as exc:  # noqa: BLE001 - run() reports typed errors itself; others come here
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(ops,), daemon=True) for ops in subs]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
                if t.is_alive():
                    raise Violation("a thread of a burst did not finish within 60 s")
        finally:
            with st.lock:
                st.threaded -= 1
        if errors:
            raise errors[0]


Ops.op_h2d_on = Ops.op_h2d  # type: ignore[attr-defined]  # the same, on the capturing stream
Ops.op_d2h_on = Ops.op_d2h  # type: ignore[attr-defined]
Ops.op_d2d_on = Ops.op_d2d  # type: ignore[attr-defined]


class _Held:
    """An unconsumed DLPack capsule held by the program (closing it drops it)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule: Any = capsule

    def close(self) -> None:
        self.capsule = None


class _CAI:
    """A foreign array: only ``__cuda_array_interface__``, holding its owner as CuPy arrays do."""

    def __init__(self, cai: dict[str, Any], owner: Any) -> None:
        self.__cuda_array_interface__ = cai
        self.owner = owner




# -- one program, and the checks after it ----------------------------------------------------------------


def snapshot(cc: Any) -> dict[str, Any]:
    """What must come back once a program closed everything: allocator counters, live objects, free memory.

    A cudacore error on the way is kept as ``"error"``: it is the program's violation, not the runner's.
    """
    from cudacore import _api

    dev = cc.Device(0)
    gc.collect()
    out: dict[str, Any] = {}
    for what, fn in (("synchronize", dev.synchronize), ("release_cached_memory", dev.release_cached_memory)):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - reported as the program's violation
            out["error"] = f"{what} raised {type(exc).__name__}: {exc}"
    stats = dev.memory_stats()
    out.update({
        "in_use": stats["in_use"],
        "pinned_in_use": stats["pinned_in_use"],
        "objects": json.loads(_api.call(_api.core.StreamObjects)),
        "free": dev.memory_info()[0],
    })  # fmt: skip
    if MIX is not None:
        MIX.snapshot(cc, out)
    return out


def cleanup(st: State) -> list[str]:
    """Close everything the program made, as a careful caller would; returns the untyped errors met."""
    cc, bad = st.cc, []

    def attempt(what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Violation as v:
            bad.append(f"cleanup {what}: {v}")
        except BaseException as exc:  # noqa: BLE001 - sorted below
            if not typed(cc, exc):
                bad.append(f"cleanup {what}: untyped {type(exc).__name__}: {exc}")
            else:
                st.note(exc)

    for cap in {id(c): c for c in st.caps.values()}.values():
        Ops._dead(st, cap)
        attempt("abort capture", cap.stream.abort_capture)
    st.caps.clear()
    attempt("synchronize", st.dev.synchronize)
    if MIX is not None:
        MIX.cleanup(st, attempt)
    # Buffers before graphs: a buffer allocated in a capture is the graph's memory, freed while the graph
    # is alive (closing it after the graph's destroy is the known bug #8, which the programs meet anyway).
    for b in list(st.bufs):
        Ops._forget(st, b)
        if b.obj is not None:
            attempt("close buffer", lambda b=b: Ops._close(st, b))
    attempt("synchronize", st.dev.synchronize)
    for g in st.graphs:
        Ops._dead(st, g.cap)
        attempt("destroy graph", g.graph.destroy)
    st.graphs.clear()
    for p in st.pinned:
        attempt("close pinned", p.obj.close)
    st.pinned.clear()
    for e in st.events:
        attempt("close event", e.close)
    st.events.clear()
    for s in st.streams:
        attempt("close stream", s.close)
    st.streams.clear()
    attempt("clear the memory limit", lambda: setattr(st.dev, "memory_limit", None))
    attempt("strategy back to auto", lambda: st.dev.set_allocation_strategy("auto"))
    return bad


#: Bugs known and being fixed elsewhere, by name, with the words of the violations they explain; the
#: program marks in State.known that it did what triggers them. None now: issue 11's items 6 (a graph
#: writing into a closed buffer's next owner) and 8 (buffers of an aborted capture or a graph destroyed
#: before a launch) are fixed, and their programs are regression tests in tests/test_fuzz.py.
KNOWN_BUGS: dict[str, tuple[str, ...]] = {}


def _explains(violation: str) -> list[str]:
    return [k for k, marks in KNOWN_BUGS.items() if any(m in violation for m in marks)]


#: How far the device's free memory may drop over a program on a real GPU, where the driver keeps memory of
#: its own (graph executables, module images, stream resources) after their first use: 32 MiB. On the
#: simulator there is none, and the free memory must come back to the byte.
GPU_FREE_SLACK = 32 << 20


def _compare(before: dict[str, Any], after: dict[str, Any], slack: int = 0) -> list[str]:
    out = [f"after the program: {after['error']}"] if "error" in after and "error" not in before else []
    shared = os.environ.get("CUDACORE_FUZZ_SHARED_DEVICE") == "1"
    for k, was in before.items():
        # On a GPU the driver may also give back memory of its own during a program: more free is fine there.
        # Each device's free memory ("free", and the mix's "device 1 free") is compared alike.
        free = k == "free" or k.endswith(" free")
        if k == "error" or after[k] == was or free and (was - after[k] <= slack or shared if slack else was == after[k]):
            continue
        out.append(f"{k} is {after[k]} after the program, {was} before")
    return out


def run_program(cc: Any, seed: int, program: list[list[Any]] | None = None, verbose: bool = False) -> dict[str, Any]:
    """Run the program of ``seed`` (or ``program``) and check it; returns its record."""
    gpu = cc.backend() == "cuda"
    if not gpu:
        # The real driver hands out the addresses of freed memory again (pool blocks, and the graph memory
        # of destroyed graphs and discarded captures), and the handles of destroyed streams: so does the
        # simulator here, so that a stale pointer or handle can name a new object as it does on a GPU.
        from cudacore import testing

        testing.set_memory_conditions(0, {"reuse_addresses": True, "reuse_handles": True})
    if MIX is not None and not _warm[0]:
        MIX.warm_up(cc)
        _warm[0] = True
    counts = dict(MIX.COUNTS) if MIX is not None else {}
    before = snapshot(cc)
    st = State(cc, gpu)
    st.verbose = verbose
    ops = program if program is not None else generate(seed)
    violations: list[str] = []
    # An exception in a finalizer (a collected Buffer whose free failed) reaches no caller: it is one too.
    unraisable: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{type(u.exc_value).__name__}: {u.exc_value}")
    try:
        for i, op in enumerate(ops):
            try:
                st.run(op)
            except Violation as v:
                violations.append(f"op {i} {op[0]}: {v}")
                break
        violations += cleanup(st)
        gc.collect()
    finally:
        sys.unraisablehook = hook
    for u in unraisable:
        if "not the start of a live allocation" in u and any(b.cap is not None for b in st.all_bufs):
            st.known.add("#8")  # a dropped buffer of a capture, freed by the collector
        violations.append(f"an exception in a finalizer: {u}")
    del st.bufs, st.pinned
    after = snapshot(cc)
    slack = GPU_FREE_SLACK if gpu else 0
    leaks = _compare(before, after, slack)
    if leaks:  # a second look after another collection tells a slow finalizer from a leak
        time.sleep(0.01)
        leaks = _compare(before, snapshot(cc), slack)
    violations += leaks
    # A violation that a known bug explains carries its name; the runner counts those apart.
    known = sorted(st.known & {k for v in violations for k in _explains(v)})
    unexplained = [v for v in violations if not set(_explains(v)) & st.known]
    rec = {"seed": seed, "ops": st.ops, "errors": st.errors, "violations": violations, "known": known,
           "unexplained": len(unexplained)}  # fmt: skip
    if MIX is not None:  # what the mix did in this program: signals delivered, children spawned...
        rec["mix"] = {k: v - counts[k] for k, v in MIX.COUNTS.items()}
    if violations:
        # How this run went, which a rerun of the seed may not repeat: the threads' order of operations
        # (the last TRACE_KEEP lines) and the interpreter's thread switch interval.
        rec["trace"] = st.trace[-TRACE_KEEP:]
        rec["trace_dropped"] = max(0, len(st.trace) - TRACE_KEEP)
        rec["switch_interval"] = sys.getswitchinterval()
    return rec


#: How many lines of a failing program's trace its record keeps (the last ones).
TRACE_KEEP = 2000

#: Whether this process made what the mix keeps for the whole process (fuzz_mix.warm_up).
_warm = [False]

#: The mix of operations (``--mix``): None for the core API alone, the fuzz_mix module for ``all``.
MIX: Any = None


def use_mix(name: str) -> None:
    """Draw from ``name`` (``core`` or ``all``, see tests/fuzz_mix.py); for ``all`` the environment of this
    process and its workers gets the mix and its two devices (before cudacore is first used)."""
    global MIX
    if name == "core" or MIX is not None:
        return
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import fuzz_mix

    os.environ.update(fuzz_mix.environment())
    fuzz_mix.install(sys.modules[__name__])
    MIX = fuzz_mix


# -- workers and the driver ------------------------------------------------------------------------------


def worker(seeds: Iterator[int], program_timeout: float) -> None:
    """Run programs, one JSON line each on stdout; a line {"start": seed} comes before each program."""
    import cudacore as cc
    from cudacore import testing

    out = sys.stdout
    # The runner's own test (tests/test_fuzz.py) makes a worker crash or hang at a chosen seed.
    selftest = os.environ.get("CUDACORE_FUZZ_SELFTEST", "")
    before: list[int] = []  # the programs this process ran first: the state they left is part of a failure
    for seed in seeds:
        out.write(json.dumps({"start": seed}) + "\n")
        out.flush()
        faulthandler.dump_traceback_later(program_timeout, exit=True)
        # The Go half of a hang report, a second before faulthandler's (which ends the process).
        testing.go_stacks_after(max(program_timeout - 1, program_timeout / 2))
        if selftest == f"crash:{seed}":
            os.abort()
        if selftest == f"hang:{seed}":
            threading.Event().wait()
        rec = run_program(cc, seed)
        faulthandler.cancel_dump_traceback_later()
        testing.go_stacks_after(None)
        if rec["violations"]:
            rec["after"] = before
        out.write(json.dumps(rec) + "\n")
        out.flush()
        if rec["violations"]:
            return  # the next programs start in a fresh process, untouched by what went wrong here
        before.append(seed)


def _spawn(seeds: list[int], program_timeout: float, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(map(str, seeds)),
           "--program-timeout", str(program_timeout)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this one, on the simulator unless a backend is set, with the cudacore
    this process would import (an installed wheel on the GPU machine, python/ in a checkout) first."""
    import importlib.util

    env = dict(os.environ)
    env.setdefault("CUDACORE_BACKEND", "sim")
    spec = importlib.util.find_spec("cudacore")
    where = str(Path(spec.origin).parent.parent) if spec is not None and spec.origin else str(HERE.parent / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH", "")) if p)
    return env


#: How much of a dead worker's stderr its record keeps (the end): enough for faulthandler's stacks of every
#: thread of a hung program.
WORKER_STDERR_KEEP = 30_000


def run_many(seeds: list[int], *, jobs: int = 1, batch: int = 100, program_timeout: float = 60.0,
             on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``seeds`` in worker processes (``jobs`` at once, ``batch`` programs each) and collect the results.

    A worker that exits or falls silent in the middle of a program (crash or hang) is a violation of that
    seed; the rest of its batch goes to a new worker.
    """
    env = _worker_env()
    if jobs > 1:
        # On a GPU the workers share the device: one's free memory moves with the others' programs, so only
        # cudacore's own accounting (in use, pinned, live objects) is compared per program there. Each
        # simulator is a process's own, and its free memory is still compared to the byte.
        env["CUDACORE_FUZZ_SHARED_DEVICE"] = "1"
    todo = [seeds[i : i + batch] for i in range(0, len(seeds), batch)]
    results: list[dict[str, Any]] = []
    running: list[tuple[subprocess.Popen[str], list[int], dict[str, Any]]] = []
    limit = program_timeout + 30  # the worker's own faulthandler fires first and prints the stacks

    def finish(rec: dict[str, Any]) -> None:
        results.append(rec)
        if on_result is not None:
            on_result(rec)

    while todo or running:
        while todo and len(running) < jobs:
            chunk = todo.pop(0)
            info = {"current": None, "since": time.monotonic(), "done": []}
            running.append((_spawn(chunk, program_timeout, env), chunk, info))
        fds = {p.stdout.fileno(): (p, chunk, info) for p, chunk, info in running}  # type: ignore[union-attr]
        ready, _, _ = select.select(list(fds), [], [], 1.0)
        for fd in ready:
            p, chunk, info = fds[fd]
            line = p.stdout.readline()  # type: ignore[union-attr]
            if line:
                msg = json.loads(line)
                if "start" in msg:
                    info["current"], info["since"] = msg["start"], time.monotonic()
                else:
                    info["current"] = None
                    chunk.remove(msg["seed"])
                    info["done"].append(msg["seed"])
                    finish(msg)
                continue
            # End of output: the worker exited.
            rc = p.wait()
            err = p.stderr.read()  # type: ignore[union-attr]
            running.remove((p, chunk, info))
            if info["current"] is not None:
                seed = info["current"]
                chunk.remove(seed)
                finish({"seed": seed, "ops": 0, "errors": {}, "after": info["done"], "violations": [
                    f"the worker died running the program (exit {rc}): {err[-WORKER_STDERR_KEEP:]}"]})  # fmt: skip
            elif rc != 0:
                finish({"seed": chunk[0] if chunk else -1, "ops": 0, "errors": {}, "after": info["done"], "violations": [
                    f"the worker exited {rc} between programs: {err[-WORKER_STDERR_KEEP:]}"]})  # fmt: skip
                chunk[:] = chunk[1:]
            if chunk:
                todo.insert(0, chunk)
        now = time.monotonic()
        for p, _chunk, info in running:
            if info["current"] is not None and now - info["since"] > limit:
                p.kill()  # the loop above sees its end of output and records the hang
    summary: dict[str, Any] = {"programs": len(results), "ops": sum(r["ops"] for r in results), "errors": {}}
    if any("mix" in r for r in results):
        summary["mix"] = {}
        for r in results:
            for k, v in r.get("mix", {}).items():
                summary["mix"][k] = summary["mix"].get(k, 0) + v
    for r in results:
        for k, v in r["errors"].items():
            summary["errors"][k] = summary["errors"].get(k, 0) + v
    summary["failed"] = [r for r in results if r["violations"] and r.get("unexplained", 1)]
    summary["known"] = {}
    for r in results:
        if r["violations"] and not r.get("unexplained", 1):
            for k in r["known"]:
                summary["known"].setdefault(k, []).append(r["seed"])
    return summary


def shrink(seed: int, program_timeout: float = 60.0) -> list[list[Any]]:
    """Remove operations from the program of ``seed`` while it still fails (in a fresh process each try)."""
    prog = generate(seed)

    def fails(p: list[list[Any]]) -> bool:
        env = _worker_env()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--run-json", json.dumps(p), "--seed", str(seed)]
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=program_timeout, check=False)
        except subprocess.TimeoutExpired:
            return True
        return r.returncode != 0

    if not fails(prog):
        return prog
    return _shrink_list(prog, lambda p: bool(p) and fails(p))


def _shrink_list(ops: list[Any], fails: Callable[[list[Any]], bool]) -> list[Any]:
    """Remove chunks of ``ops`` (halving the chunk) while ``fails`` holds, then shrink nested lists (the
    body of a capture, the threads of a burst) the same way."""
    chunk = len(ops) // 2
    while chunk >= 1:
        i = 0
        while i < len(ops):
            cand = ops[:i] + ops[i + chunk :]
            if fails(cand):
                ops = cand
            else:
                i += chunk
        chunk //= 2
    for i, item in enumerate(ops):
        if item and isinstance(item[0], str) and isinstance(item[-1], list):  # an op with a body
            head, body = item[:-1], item[-1]
        elif item and isinstance(item[0], list):  # one thread's operations
            head, body = None, item
        else:
            continue

        def with_sub(sub: list[Any], i: int = i, head: list[Any] | None = head, ops: list[Any] = ops) -> list[Any]:
            return ops[:i] + [sub if head is None else [*head, sub]] + ops[i + 1 :]

        ops = with_sub(_shrink_list(body, lambda sub, with_sub=with_sub: fails(with_sub(sub))))
    return ops


#: The thread switch intervals --hunt draws from (seconds; Python's default is 0.005): short ones make the
#: threads of a burst interleave at many more points.
SWITCH_INTERVALS = (1e-6, 1e-5, 1e-4, 0.005)

#: The environment a failure's record names (what changes how a program runs); nothing else is copied.
CONTEXT_ENV = ("PYTHONHASHSEED", "GOMAXPROCS", "GODEBUG", "GOGC")


def _context(argv: list[str]) -> dict[str, Any]:
    """Where a failing program ran: the command line and the environment that shapes the run."""
    env = {k: v for k, v in os.environ.items() if k.startswith("CUDACORE_") or k in CONTEXT_ENV}
    return {"argv": argv, "env": env, "python": sys.version.split()[0], "when": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _save_failure(path: str, rec: dict[str, Any], context: dict[str, Any]) -> None:
    """Append a failing program's whole record (every violation in full, the trace of its threads, the
    programs its process ran before it) and where it ran to ``path``, one JSON line."""
    with open(path, "a") as f:
        f.write(json.dumps({**rec, **context}) + "\n")


def hunt(cc: Any, seed: int, first: int, rounds: int) -> dict[str, Any] | None:
    """Run the programs ``first``..``seed`` in this process, as a worker ran them, ``rounds`` times, each
    round with another thread switch interval, until one fails; returns the failing record, or None.

    A program whose threads race fails only under some interleavings, which a rerun of its seed alone in a
    fresh process rarely meets again; rerunning it after the programs its worker ran first, with the
    threads switching more often, meets them far sooner.
    """
    rng = random.Random()
    for r in range(rounds):
        sys.setswitchinterval(rng.choice(SWITCH_INTERVALS))
        before: list[int] = []
        for s in range(first, seed + 1):
            rec = run_program(cc, s)
            if rec["violations"] and rec["unexplained"]:
                rec["after"], rec["round"] = before, r
                return rec
            before.append(s)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=200, help="how many programs (default 200)")
    ap.add_argument("--mix", choices=("core", "all"), default=os.environ.get("CUDACORE_FUZZ_MIX", "core"),
                    help="core: the API of issue 11 on one device; all: also two devices, peer copies, shared memory "
                         "and IPC (spawned children too), managed memory, graphed, rehearse, the flight recorder, "
                         "Ctrl-C at random points (tests/fuzz_mix.py)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0, help="the first seed (programs use seed, seed+1, ...)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at once")
    ap.add_argument("--batch", type=int, default=100, help="programs per worker process")
    ap.add_argument("--program-timeout", type=float, default=60.0, help="seconds one program may take")
    ap.add_argument("--replay", type=int, help="run the program of this seed here, printing each operation")
    ap.add_argument("--shrink", type=int, help="print the smallest failing sub-program of this seed")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--run-json", help=argparse.SUPPRESS)
    ap.add_argument("--progress", action="store_true", help="print a line per 100 programs to stderr")
    ap.add_argument("--out", help="append every program's record to this file (JSON lines)")
    ap.add_argument("--inline", action="store_true",
                    help="run the programs in this process, with no workers (for compute-sanitizer); a crash or hang ends the run")  # fmt: skip
    ap.add_argument("--failures", default="fuzz-failures.jsonl",
                    help="append each failing program's whole record (every violation, the order its threads ran "
                         "their operations in, the programs run before it in its process, the environment) to this "
                         "file (default fuzz-failures.jsonl; '' for none)")  # fmt: skip
    ap.add_argument("--hunt", type=int, metavar="SEED",
                    help="rerun the program of SEED after those its worker ran first (--hunt-from), in this process, "
                         "with varied thread switch intervals, until it fails (--rounds times at most): for a failure "
                         "that a plain rerun does not repeat")  # fmt: skip
    ap.add_argument("--hunt-from", type=int, metavar="FIRST",
                    help="the first program of SEED's worker (default: SEED rounded down to a multiple of --batch)")
    ap.add_argument("--rounds", type=int, default=200, help="rounds of --hunt (default 200)")
    ap.add_argument("--without", default="", metavar="OPS",
                    help="comma-separated operations never to draw (e.g. h2d,d2h), to narrow down what a failure "
                         "needs; the programs then differ from those of the same seeds without it")  # fmt: skip
    ap.add_argument("--verbose", action="store_true",
                    help="with --inline, print each operation to stderr before it runs (the last lines before a crash name it)")  # fmt: skip
    ap.add_argument("--no-per-thread", action="store_true",
                    help="never pass the per-thread default stream (the programs then differ from those of the same seeds without it)")  # fmt: skip
    args = ap.parse_args(argv)
    use_mix(args.mix)
    if args.no_per_thread:
        os.environ["CUDACORE_FUZZ_NO_PER_THREAD"] = "1"
        global NO_PER_THREAD
        NO_PER_THREAD = True
    if args.without:
        known = set(TOP_OPS) | set(CAPTURE_OPS)
        unknown = sorted(set(args.without.split(",")) - known)
        if unknown:
            ap.error(f"--without: unknown operations {unknown}; known: {sorted(known)}")
        os.environ["CUDACORE_FUZZ_WITHOUT"] = args.without
        global WITHOUT
        WITHOUT = frozenset(args.without.split(","))
    context = _context(list(sys.argv[1:] if argv is None else argv))

    def failed_here(rec: dict[str, Any]) -> str:
        """Save a failing record (see --failures) and say where it went."""
        if not args.failures:
            return ""
        _save_failure(args.failures, rec, context)
        return f" (the whole record: {os.path.abspath(args.failures)})"

    if args.worker is not None:
        worker((int(s) for s in args.worker.split(",") if s), args.program_timeout)
        return 0
    if args.replay is not None or args.run_json is not None:
        os.environ.setdefault("CUDACORE_BACKEND", "sim")
        import cudacore as cc

        prog = json.loads(args.run_json) if args.run_json else None
        seed = args.replay if args.replay is not None else args.seed
        rec = run_program(cc, seed, prog, verbose=args.replay is not None)
        print(json.dumps(rec))
        return 1 if rec["violations"] else 0
    if args.inline:
        os.environ.setdefault("CUDACORE_BACKEND", "sim")
        import cudacore as cc

        t0, failed, known, total_ops = time.monotonic(), [], 0, 0
        ran: list[int] = []
        mixed: dict[str, int] = {}
        for seed in range(args.seed, args.seed + args.programs):
            if args.verbose:
                print(f"== program {seed}", file=sys.stderr, flush=True)
            rec = run_program(cc, seed, verbose=args.verbose)
            total_ops += rec["ops"]
            for k, v in rec.get("mix", {}).items():
                mixed[k] = mixed.get(k, 0) + v
            if rec["violations"] and rec["unexplained"]:
                failed.append(seed)
                rec["after"] = list(ran)
                where = failed_here(rec)
                print(f"seed {seed}: {rec['violations'][0][:2000]}{where}", file=sys.stderr, flush=True)
            known += bool(rec["violations"]) and not rec["unexplained"]
            ran.append(seed)
        print(json.dumps({"programs": args.programs, "ops": total_ops, "known_bug_programs": known, "mix": mixed,
                          "failed_seeds": failed, "seconds": round(time.monotonic() - t0, 1)}))  # fmt: skip
        return 1 if failed else 0
    if args.hunt is not None:
        os.environ.setdefault("CUDACORE_BACKEND", "sim")
        import cudacore as cc

        first = args.hunt_from if args.hunt_from is not None else args.hunt - args.hunt % args.batch
        rec = hunt(cc, args.hunt, first, args.rounds)
        if rec is None:
            print(json.dumps({"hunt": args.hunt, "from": first, "rounds": args.rounds, "failed": False}))
            return 0
        where = failed_here(rec)
        print(f"seed {rec['seed']} (round {rec['round']}): {rec['violations'][0][:2000]}{where}", file=sys.stderr, flush=True)
        print(json.dumps({"hunt": args.hunt, "from": first, "rounds": rec["round"] + 1, "failed": True, "seed": rec["seed"]}))
        return 1
    if args.shrink is not None:
        prog = shrink(args.shrink, args.program_timeout)
        print(json.dumps(prog))
        return 0
    start = time.monotonic()
    done = [0]

    sink = open(args.out, "a") if args.out else None  # noqa: SIM115 - closed below

    def progress(rec: dict[str, Any]) -> None:
        done[0] += 1
        if sink is not None:
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
        if rec["violations"] and rec.get("unexplained", 1):
            where = failed_here(rec)
            print(f"seed {rec['seed']}: {rec['violations'][0][:2000]}{where}", file=sys.stderr, flush=True)
        if args.progress and done[0] % 100 == 0:
            print(f"{done[0]} programs, {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    summary = run_many(list(range(args.seed, args.seed + args.programs)), jobs=args.jobs, batch=args.batch,
                       program_timeout=args.program_timeout, on_result=progress)  # fmt: skip
    if sink is not None:
        sink.close()
    summary["seconds"] = round(time.monotonic() - start, 1)
    summary["failed_seeds"] = [r["seed"] for r in summary.pop("failed")]
    print(json.dumps(summary))
    return 1 if summary["failed_seeds"] else 0


if os.environ.get("CUDACORE_FUZZ_MIX") == "all":  # a worker of --mix all, or a caller that set it
    use_mix("all")

if __name__ == "__main__":
    sys.exit(main())

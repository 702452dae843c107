"""A storm of real SIGINTs over the calls that make and give back what cudacore owns (issue 30, item 18).

    python tests/sigint_storm.py --seconds 60        # prints one JSON line of counts; exit 1 on a violation

A thread sends SIGINT to the main thread every few hundred microseconds (``signal.pthread_kill``: the
signal arrives wherever the main thread is, and Python's handler raises KeyboardInterrupt at its next
check) while the main thread makes and closes streams, events (both kinds), Buffers, pinned, managed and
shareable memory (exported, its handle closed), tiles, modules, capture blocks and explicit captures,
catching every KeyboardInterrupt and going on. The storm then stops, everything still held is closed, and
the accounting must be back where it started: the live streams, events, graphs, captures and modules, the
device's in_use, pinned_in_use, shared_in_use and managed_in_use, and the open file descriptors; no stream
may be left capturing by a capture block, and no error but KeyboardInterrupt may come out of a call.

What the loop makes is kept in one C-level step (``list.extend`` over ``map``), and closed before it
leaves the list, so that the loop itself never drops an object to a finalizer: an interrupt inside a
finalizer is dropped by Python whatever the finalizer does (the limit docs/contributing/design.md states),
and the collector, which runs finalizers wherever it is triggered, is off during the storm.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PTX = (Path(__file__).resolve().parent / "kernels" / "fill.ptx").read_bytes()


def _accounting(cc: Any, d: Any) -> dict[str, Any]:
    from cudacore import _api, _ipc

    gc.collect()
    d.synchronize()
    d.release_cached_memory()
    stats = d.memory_stats()
    out: dict[str, Any] = {k: stats[k] for k in ("in_use", "pinned_in_use", "pinned_staging", "shared_in_use", "managed_in_use")}
    out["objects"] = json.loads(_api.call(_api.core.StreamObjects))
    out["objects"]["events"] -= len(_ipc._sync_events)  # the event an export waits with, kept per device
    _ipc._forget_idle_leases()  # the leases imports here kept mapped, whose exports are closed now
    out["descriptors"] = len(os.listdir("/proc/self/fd")) - len(_ipc._pool_fds)
    return out


def close_all(kept: list[Any]) -> None:
    """Close what ``kept`` holds, newest first, each before it leaves the list."""
    while kept:
        obj = kept[-1]
        obj.close()
        kept.pop()


def _ops(cc: Any, d: Any, s: Any, src: Any, dst: Any) -> dict[str, Callable[[list[Any]], None]]:
    """Each operation makes things (kept in ``kept`` in one C-level step), uses them and closes them,
    newest first, each before it leaves ``kept``."""

    def make(kept: list[Any], fn: Callable[[], Any]) -> Any:
        kept.extend(map(lambda _: fn(), [None]))  # noqa: C417 - map is C: no signal check between fn() and the append
        return kept[-1]

    def stream(kept: list[Any]) -> None:
        make(kept, lambda: d.create_stream())
        close_all(kept)

    def events(kept: list[Any]) -> None:
        make(kept, lambda: cc.Event(d))
        make(kept, lambda: cc.Event(d, interprocess=True))
        close_all(kept)

    def buffers(kept: list[Any]) -> None:
        b = make(kept, lambda: d.allocate(4096, stream=s))
        p = make(kept, lambda: d.allocate_pinned(4096))
        b.copy_from(p, stream=s)
        s.synchronize()
        close_all(kept)

    def staged_copies(kept: list[Any]) -> None:
        # Pageable copies of several staging chunks, both ways, synchronous and on s: through the staging
        # pool, pausing for each burst to drain (the storm's tuning: storm()).
        b = make(kept, lambda: d.allocate(len(pageable), stream=s))
        for stream in (None, s):
            b.copy_from(pageable, stream=stream)
            b.copy_to(landing, stream=stream)
        b.copy_from(pageable, nbytes=4096)  # the driver's own copy, then a wait for the legacy stream
        close_all(kept)

    def managed(kept: list[Any]) -> None:
        m = make(kept, lambda: d.allocate_managed(4096))
        m.copy_from(bytes(4096))
        close_all(kept)

    def tiles(kept: list[Any]) -> None:
        kept.extend(d.allocate_tiles(3, 4096, stream=s))
        close_all(kept)

    def shareable(kept: list[Any], kinds: tuple[str, ...] = ("pool", "ipc")) -> None:
        for kind in kinds:
            sb = make(kept, lambda kind=kind: d.allocate_shareable(4096, kind=kind))
            make(kept, lambda sb=sb: sb.export())
        close_all(kept)

    def module(kept: list[Any]) -> None:
        make(kept, lambda: d.load_module(PTX))
        close_all(kept)

    def capture_block(kept: list[Any]) -> None:
        try:
            with s.capture() as g:
                kept.append(g)
                cc.device_to_device(dst, src, stream=s)
                with d.allocate(4096, stream=s):
                    pass
        finally:
            if s.capturing:
                raise AssertionError("a capture block left its stream capturing")
        g.launch(s)
        close_all(kept)

    def explicit_capture(kept: list[Any]) -> None:
        kept.append(_Abort(s))
        s.begin_capture()
        cc.device_to_device(dst, src, stream=s)
        make(kept, lambda: s.end_capture())
        close_all(kept)

    # Past the driver's own pageable copies (1 MiB): seventeen staging chunks of the storm's tuning (storm()).
    pageable, landing = bytes(range(256)) * 4112, bytearray(256 * 4112)
    return {f.__name__: f for f in (stream, events, buffers, staged_copies, managed, tiles, shareable, module, capture_block, explicit_capture)}


class _Abort:
    """Discards a capture the loop began and an interrupt kept it from ending."""

    def __init__(self, s: Any) -> None:
        self.s = s

    def close(self) -> None:
        if self.s.capturing:
            self.s.abort_capture()


def storm(seconds: float, seed: int = 0, interval_us: int = 400, only: list[str] | None = None) -> dict[str, Any]:
    import cudacore as cc
    from cudacore._copy import staging_tuning

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("the storm runs in the main thread")
    # A KeyboardInterrupt inside an operation (as Python's own handler raises it); one that comes between
    # two, in this loop's own code, is counted and dropped, so that the loop goes on.
    state = {"in_op": False, "outside": 0}

    def handler(signum: int, frame: Any) -> None:
        if state["in_op"]:
            raise KeyboardInterrupt
        state["outside"] += 1

    previous = signal.signal(signal.SIGINT, handler)
    d = cc.Device(0)
    # Small staging chunks, and a pause for the copy engine to drain after every two of them (the staging
    # tuning hook: the pool is freed with each change, so the pause and the pool's growth are both met).
    tuning = staging_tuning(d.device_id)
    staging_tuning(d.device_id, chunk=64 << 10, buffers=3, workers=4, piece=16 << 10, burst=128 << 10)
    s = d.create_stream()
    src, dst = d.allocate(4096, stream=s), d.allocate(4096, stream=s)
    ops = _ops(cc, d, s, src, dst)
    for op in ops.values():  # warm: what cudacore makes once per process (each kind's export: the
        op([])  # exportable pool and its descriptors, the event an export waits with, ...)
    before = _accounting(cc, d)
    rng = random.Random(seed)
    counts: dict[str, Any] = {"seconds": seconds, "ops": 0, "interrupts": 0, "sent": 0, "violations": []}
    stop = threading.Event()
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        r = random.Random(seed + 1)
        while not stop.wait(r.uniform(0, 2 * interval_us) / 1e6):
            signal.pthread_kill(main, signal.SIGINT)
            counts["sent"] += 1

    kept: list[Any] = []
    names = only or list(ops)
    sender = threading.Thread(target=send, daemon=True)
    gc.disable()
    deadline = time.monotonic() + seconds
    sender.start()
    try:
        while time.monotonic() < deadline:
            try:
                name = names[rng.randrange(len(names))]
                counts["ops"] += 1
                state["in_op"] = True
                try:
                    close_all(kept)  # what an interrupted operation left
                    ops[name](kept)
                finally:
                    state["in_op"] = False
            except KeyboardInterrupt:
                counts["interrupts"] += 1
            except AssertionError as exc:
                counts["violations"].append(f"{name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - the violation
                counts["violations"].append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        stop.set()
        sender.join()
        gc.enable()
    time.sleep(0.05)  # a signal sent last is handled (outside the operations)
    signal.signal(signal.SIGINT, previous)
    counts["between_ops"] = state["outside"]
    while kept:
        obj = kept.pop()
        try:
            obj.close()
        except Exception as exc:  # noqa: BLE001 - the violation
            counts["violations"].append(f"closing {type(obj).__name__}: {type(exc).__name__}: {exc}")
    after = _accounting(cc, d)
    for k, was in before.items():
        if after[k] != was:
            counts["violations"].append(f"{k} is {after[k]} after the storm, {was} before")
    for x in (src, dst, s):
        x.close()
    staging_tuning(d.device_id, **tuning)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interval-us", type=int, default=400, help="the mean time between two signals")
    ap.add_argument("--op", action="append", help="only this operation (repeatable)")
    args = ap.parse_args(argv)
    counts = storm(args.seconds, args.seed, args.interval_us, args.op)
    print(json.dumps(counts))
    return 1 if counts["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Stream-ordered pool memory on short-lived threads' per-thread default streams, through cudacore: each
round a new thread allocates and/or frees on its per-thread default stream (cc.Stream.per_thread) with a
device copy between, and exits; the main thread meanwhile allocates, copies and frees on its own stream.
A round that does not finish within 20 s ends the process with the stacks (a hang).

    python scripts/gpu/per_thread_pool.py ROUNDS {both,alloc,free} [--drain]

both: the thread allocates and frees there; alloc: it allocates there and the main thread frees the block
on the main stream; free: the main thread allocates on the main stream and the thread frees it on its
per-thread stream. --drain: the thread synchronizes its per-thread stream before it exits.
"""

import faulthandler
import sys
import threading
import time

import cudacore as cc

rounds, how = int(sys.argv[1]), sys.argv[2]
drain = "--drain" in sys.argv
d = cc.Device(0)
main_stream = d.create_stream()
src = d.allocate(4 << 20, stream=main_stream)
handed: list = []


def worker() -> None:
    pt = cc.Stream.per_thread(d)
    if how in ("both", "alloc"):
        b = d.allocate(1 << 20, stream=pt)
        cc.device_to_device(b, src, stream=pt, nbytes=1 << 20)
        if how == "both":
            b.close()
        else:
            handed.append(b)
    else:
        b = handed.pop()
        cc.device_to_device(b, src, stream=pt, nbytes=1 << 20)
        b.close()
    if drain:
        pt.synchronize()


t0 = time.monotonic()
for _ in range(rounds):
    faulthandler.dump_traceback_later(20, exit=True)
    if how == "free":
        handed.append(d.allocate(1 << 20, stream=main_stream))
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if how == "alloc":
        handed.pop().close()
    x = d.allocate(1 << 20, stream=main_stream)
    cc.device_to_device(x, src, stream=main_stream, nbytes=1 << 20)
    x.close()
    main_stream.synchronize()
    faulthandler.cancel_dump_traceback_later()
d.synchronize()
print(f"{how}{' drain' if drain else ''}: {rounds} rounds in {time.monotonic() - t0:.1f} s, no hang", flush=True)

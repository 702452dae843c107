"""Does work recorded on a thread's per-thread default stream outlive the thread? A short-lived thread
queues device copies and an event record on its per-thread default stream and exits; the main thread
then waits for the event (the way given on the command line). Run several of these processes at once
to load the GPU. A wait that does not return within the watchdog's time ends the process with the stacks.

    python scripts/gpu/per_thread_exit.py ROUNDS {query,sync,wait,none} [--own-stream]
"""

import faulthandler
import sys
import threading
import time

import cudacore as cc
from cudacore import testing

rounds, how = int(sys.argv[1]), sys.argv[2]
own = "--own-stream" in sys.argv
d = cc.Device(0)
n = 64 << 20
a, b = d.allocate(n), d.allocate(n)
s = d.create_stream()
ev = cc.Event(d, timing=False)


def worker() -> None:
    st = d.create_stream() if own else cc.Stream.per_thread(d)
    for _ in range(8):
        cc.device_to_device(b, a, stream=st)
    ev.record(st)
    if own:
        st.close()


t0 = time.monotonic()
for _ in range(rounds):
    faulthandler.dump_traceback_later(20, exit=True)
    testing.go_stacks_after(19)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if how == "query":
        while not ev.query():
            pass
    elif how == "sync":
        ev.synchronize()
    elif how == "wait":
        s.wait(ev)
        s.synchronize()
    faulthandler.cancel_dump_traceback_later()
    testing.go_stacks_after(None)
d.synchronize()
print(f"{how}{' own' if own else ''}: {rounds} rounds in {time.monotonic() - t0:.1f} s, no hang", flush=True)

"""Which allocation a fuzzer program leaves in use, on the GPU machine: run one program of tests/fuzz.py in
this process with the flight recorder keeping Python stacks, then print the alloc events whose memory no free
event gave back, with their stacks and the events around them.

    python scripts/gpu/leak_trace.py SEED
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import cudacore as cc
import fuzz


def main() -> None:
    seed = int(sys.argv[1])
    cc.configure_flight_recorder(enabled=True, capacity=1 << 16, python_stacks=12)
    rec = fuzz.run_program(cc, seed)
    gc.collect()
    print("violations:", rec["violations"])
    events = cc.flight_record()
    live: dict[tuple[int, int], dict] = {}
    for e in events:
        key = (e["device"], e["ptr"])
        if e["kind"] == "alloc":
            live[key] = e
        elif e["kind"] == "free":
            live.pop(key, None)
    for e in live.values():
        print("\nnever freed:", {k: e[k] for k in ("seq", "kind", "ptr", "size", "stream", "in_use")})
        print("  stack:", e.get("note"))
        for n in events:
            if abs(n["seq"] - e["seq"]) <= 6:
                print("   ", n["seq"], n["kind"], hex(n["ptr"]), n["size"], hex(n["stream"]), (n.get("note") or "")[:160].replace("\n", " | "))


if __name__ == "__main__":
    main()

"""Which allocations a fuzzer program leaves behind, for runs where in_use grows (under compute-sanitizer,
say). Runs the fuzzer's programs inline with Python stacks in the flight recorder and, after each program
that broke an invariant, prints its violations, the allocator's counters, the allocations made during it
that no free followed (with the Python frames that made them, and whether Go reported the address as void
graph memory), and the last lines of its trace. On the GPU machine, from the repository root:

    CUDACORE_BACKEND=cuda compute-sanitizer --tool memcheck --leak-check full --report-api-errors no \\
        --show-backtrace device python3 scripts/gpu/sanitizer_growth.py 5000 30

(With the sanitizer's default host backtraces, a Buffer that a function allocated and then dropped stays
alive: the sanitizer keeps the Python frame of each driver call, and with it the frame's locals;
docs/contributing/driver-facts.md, "Tools on the GPU machine".)

On the simulator it also turns on the memory condition reuse_addresses (released addresses handed out
again, as the driver does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import cudacore as cc
import fuzz
from cudacore import _stream

COUNTERS = ("in_use", "failures", "graph_destroy_failures", "graph_destroys_pending", "recycled", "cached", "strategy")


def main() -> None:
    first, count = int(sys.argv[1]), int(sys.argv[2])
    cc.configure_flight_recorder(python_stacks=True)
    dev = cc.Device(0)
    if cc.backend() == "sim":
        from cudacore import testing

        testing.set_memory_conditions(0, {"reuse_addresses": True})
    voided: list[int] = []  # every address Go reported as void graph memory
    graph_voided = _stream.core.GraphVoided

    def logged(device: int) -> str:
        text = graph_voided(device)
        voided.extend(int(x.partition(":")[0]) for x in text.split(",") if x)
        return text

    _stream.core.GraphVoided = logged
    for seed in range(first, first + count):
        last = cc.flight_record(1)
        start = last[-1]["seq"] if last else 0
        rec = fuzz.run_program(cc, seed)
        if not rec["violations"]:
            continue
        stats = dev.memory_stats()
        print("SEED", seed, rec["violations"][:3], {k: stats.get(k) for k in COUNTERS}, "errors", rec["errors"], flush=True)
        live: dict[tuple[int, int], dict] = {}
        for e in cc.flight_record(after=start):
            if e["kind"] == "alloc":
                live[(e["device"], e["ptr"])] = e
            elif e["kind"] == "free":
                live.pop((e["device"], e["ptr"]), None)
        for e in live.values():
            print("   UNFREED void" if e["ptr"] in voided else "   UNFREED", json.dumps(e)[:1500], flush=True)
        for line in rec.get("trace", [])[-60:]:
            print("   TRACE", line[:400], flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()

"""What the flight recorder costs: the alloc+free pair with the recorder on and off, measured in one run.

    python bench/recorder.py                          # on a GPU machine
    CUDACORE_BACKEND=sim python bench/recorder.py --quick   # on the simulator (smoke test)

The recorder is on by default and meant to stay on, so its budget is 5% of the pair. Each round times
every variant once (recorder off, on, and on with Python stacks), in an order that rotates from round to
round, so drift of a shared machine hits all alike; the table gives the median and the minimum over rounds
of the microseconds per pair, and the overhead of each against "off": the median of the per-round ratios,
and the ratio of the minimums (on a noisy machine the minimum is the steadier estimate).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import cudacore as cc

SIZES = [256, 1 << 20]


def pairs(size: int) -> Callable[[int], None]:
    alloc = cc.Device(0).allocate

    def run(n: int) -> None:
        for _ in range(n):
            alloc(size).close()

    return run


def variant(name: str) -> None:
    if name == "off":
        cc.configure_flight_recorder(enabled=False, python_stacks=False)
    elif name == "on":
        cc.configure_flight_recorder(enabled=True, python_stacks=False)
    else:
        cc.configure_flight_recorder(enabled=True, python_stacks=8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=61)
    ap.add_argument("--pairs", type=int, default=4000, help="pairs per timing (short, so that the variants interleave finely)")
    ap.add_argument("--quick", action="store_true", help="few rounds and pairs: a smoke test")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.pairs = 3, 2000
    names = ["off", "on", "on + python stacks"]
    d = cc.Device(0)
    print(f"# {cc.backend()} backend, device 0: {d.name}; {args.rounds} rounds of {args.pairs} pairs per variant")
    print(f"{'size':>8}  {'variant':<20}{'median us':>10}{'min us':>9}{'overhead':>10}{'of mins':>9}")
    for size in SIZES:
        run = pairs(size)
        for name in names:  # warm every path (cache, recorder, labels)
            variant(name)
            run(1000)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                variant(name)
                t0 = time.perf_counter()
                run(args.pairs)
                times[name].append((time.perf_counter() - t0) / args.pairs * 1e6)
        base = times["off"]
        for name in names:
            med, low = statistics.median(times[name]), min(times[name])
            # overhead per round against the same round's "off", then the median: rounds pair up
            ratio = statistics.median(t / b - 1 for t, b in zip(times[name], base, strict=True))
            shown = "" if name == "off" else f"{ratio * 100:+.1f}%"
            mins = "" if name == "off" else f"{(low / min(base) - 1) * 100:+.1f}%"
            print(f"{size:>8}  {name:<20}{med:>10.3f}{low:>9.3f}{shown:>10}{mins:>9}")
    variant("on")


if __name__ == "__main__":
    main()

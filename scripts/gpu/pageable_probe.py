"""Pageable copies against the link and the driver (issue 29, item 3): cudacore's staged copies under a
handful of staging settings, both directions, beside the driver's own pageable copy and the pinned link in
the same run, and the latency of another stream's small copies while a 1 GiB pageable copy runs.

On the GPU machine, with the wheel installed into gpu-site (docs/contributing/gpu-testing.md):

    PYTHONPATH=gpu-site CUDACORE_BACKEND=cuda python3 scripts/gpu/pageable_probe.py
    PYTHONPATH=gpu-site python3 scripts/gpu/pageable_probe.py --quick       # 3 rounds, 16 MiB and 256 MiB

Every contender is timed in every round, rounds interleaved, and tables give medians over rounds in GB/s.
A staged copy is timed as copy + the driver's cuStreamSynchronize of its stream (the copy's own cost, not
that of cudacore's interruptible wait); the driver's row is cuMemcpyHtoDAsync / cuMemcpyDtoHAsync from or
into the same numpy memory plus the same synchronize (cuda.bindings); the pinned row is a PinnedBuffer
copy, the link's rate. Settings are applied with the internal hook cudacore._copy.staging_tuning, which
frees the staging buffers: each setting's first copy (not timed) allocates them again.

The last lines check the targets with the default setting: from 64 MiB, host to device >= 40 GB/s and
device to host >= 35 GB/s; at 16 MiB >= 2x the driver; at 256 KiB no slower than the driver (5% noise
allowed); another stream's 64 KiB pinned copy, while a 1 GiB pageable copy runs, no slower (median) than
while the driver's own pageable copy runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
SIZES = [16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
SMALL = 256 << 10

#: The staging settings swept: (name, fields for staging_tuning). The defaults first; each other one moves
#: one knob (or two that go together: a chunk size and the buffers that keep the pool at 32 MiB).
SETTINGS: list[tuple[str, dict[str, int]]] = [
    ("default", {}),
    ("no drain", {"burst": -1}),
    ("burst 4M", {"burst": 4 * MiB}),
    ("burst 8M", {"burst": 8 * MiB}),
    ("burst 64M", {"burst": 64 * MiB}),
    ("chunk 1M x 16", {"chunk": MiB, "buffers": 16}),
    ("chunk 8M x 4", {"chunk": 8 * MiB, "buffers": 4}),
    ("chunk 2M x 16", {"chunk": 2 * MiB, "buffers": 16}),
    ("chunk 16M x 4", {"chunk": 16 * MiB, "buffers": 4, "piece": 2 * MiB}),
    ("workers 4", {"workers": 4}),
    ("workers 12", {"workers": 12}),
    ("workers 16", {"workers": 16}),
    ("piece 256K", {"piece": 256 << 10}),
    ("workers 1", {"workers": 1}),
]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Driver:
    """cuda.bindings on the primary context cudacore uses."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.cu = driver
        self.ok(driver.cuInit(0))
        self.ctx = self.ok(driver.cuDevicePrimaryCtxRetain(self.ok(driver.cuDeviceGet(0))))
        self.current()

    def current(self) -> None:
        """Make the context current on the calling thread."""
        self.ok(self.cu.cuCtxSetCurrent(self.ctx))

    def ok(self, ret: Any) -> Any:
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            raise RuntimeError(f"cuda.bindings call failed: {err}")
        return ret[1] if isinstance(ret, tuple) and len(ret) == 2 else None

    def stream(self, handle: int) -> Any:
        return self.cu.CUstream(handle)

    def sync(self, stream: Any) -> None:
        self.ok(self.cu.cuStreamSynchronize(stream))

    def htod(self, dptr: int, hptr: int, n: int, stream: Any) -> None:
        self.ok(self.cu.cuMemcpyHtoDAsync(self.cu.CUdeviceptr(dptr), hptr, n, stream))

    def dtoh(self, hptr: int, dptr: int, n: int, stream: Any) -> None:
        self.ok(self.cu.cuMemcpyDtoHAsync(hptr, self.cu.CUdeviceptr(dptr), n, stream))


class Rig:
    """What the measurements share: device 0, a stream, a device buffer, pageable and pinned host memory of
    the largest size (smaller copies use the front of each)."""

    def __init__(self, cc: Any, np: Any, drv: Driver, largest: int) -> None:
        self.cc, self.np, self.drv = cc, np, drv
        self.dev = cc.Device(0)
        self.s = self.dev.create_stream()
        self.raw = drv.stream(self.s.handle)
        self.dbuf = self.dev.allocate(largest, stream=self.s)
        # Random bytes repeating with a prime period (no chunk size divides it, so a chunk landing at the
        # wrong offset shows), every page touched, so that no copy pays for first faults.
        self.host = np.resize(np.random.default_rng(1).integers(0, 256, 1_000_003, dtype=np.uint8), largest)
        self.out = np.empty(largest, np.uint8)
        self.out[:] = 0
        self.pinned = self.dev.allocate_pinned(largest)

    def copy(self, n: int, to_device: bool, how: str) -> Callable[[], None]:
        """One copy of the first n bytes, waited for: how is "cudacore" (pageable, staged above 1 MiB),
        "driver" (the driver's pageable copy) or "pinned" (a PinnedBuffer copy)."""
        raw, drv, s = self.raw, self.drv, self.s
        if how in ("cudacore", "pinned"):
            host = self.pinned if how == "pinned" else self.host if to_device else self.out
            move = self.dbuf.copy_from if to_device else self.dbuf.copy_to

            def run() -> None:
                move(host, stream=s, nbytes=n)
                drv.sync(raw)

            return run
        dptr = self.dbuf.ptr
        if to_device:
            src = self.host.ctypes.data

            def run() -> None:
                drv.htod(dptr, src, n, raw)
                drv.sync(raw)

            return run
        dst = self.out.ctypes.data

        def run() -> None:
            drv.dtoh(dst, dptr, n, raw)
            drv.sync(raw)

        return run

    def close(self) -> None:
        self.s.synchronize()
        self.dbuf.close()
        self.pinned.close()
        self.s.close()


def reps_for(n: int) -> int:
    return max(1, (256 * MiB) // n)


def timed(run: Callable[[], None], n: int) -> float:
    """GB/s of reps_for(n) runs after one untimed run."""
    run()
    reps = reps_for(n)
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    return n * reps / (time.perf_counter() - t0) / 1e9


def check_bytes(rig: Rig, n: int) -> None:
    """A round trip of n bytes through the staged paths lands every byte (each setting, once)."""
    from cudacore._copy import staging_tuning

    rig.out[:n] = 0
    rig.dbuf.copy_from(rig.host, stream=rig.s, nbytes=n)
    rig.dbuf.copy_to(rig.out, stream=rig.s, nbytes=n)
    if not rig.np.array_equal(rig.host[:n], rig.out[:n]):
        raise SystemExit(f"bytes differ after a staged round trip of {n} bytes under {staging_tuning(0)}")


def sweep(rig: Rig, sizes: list[int], rounds: int, settings: list[tuple[str, dict[str, int]]]) -> dict[tuple, list[float]]:
    """GB/s per (contender, direction, size), one list entry per round."""
    from cudacore._copy import staging_tuning

    res: dict[tuple, list[float]] = {}
    for r in range(rounds):
        order = settings[r % len(settings):] + settings[: r % len(settings)]  # a different one first each round
        for name, fields in order:
            staging_tuning(0, **(fields or {"chunk": 0}))
            if r == 0:
                check_bytes(rig, min(max(sizes) - 1, 37 * MiB + 123))
            for n in sizes:
                for to_device in (True, False):
                    res.setdefault((name, to_device, n), []).append(timed(rig.copy(n, to_device, "cudacore"), n))
        staging_tuning(0, chunk=0)
        for how in ("driver", "pinned"):
            for n in sizes:
                for to_device in (True, False):
                    res.setdefault((how, to_device, n), []).append(timed(rig.copy(n, to_device, how), n))
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return res


def small_rows(rig: Rig, rounds: int) -> dict[tuple, list[float]]:
    """Below the staging bound: cudacore (default setting) against the driver at 256 KiB, both ways."""
    from cudacore._copy import staging_tuning

    staging_tuning(0, chunk=0)
    res: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for how in ("cudacore", "driver"):
            for to_device in (True, False):
                run = rig.copy(SMALL, to_device, how)
                run()
                reps = 400
                t0 = time.perf_counter()
                for _i in range(reps):
                    run()
                res.setdefault((how, to_device, SMALL), []).append(SMALL * reps / (time.perf_counter() - t0) / 1e9)
    return res


def repeat(drv: Driver, run: Callable[[], None], stop: threading.Event, errors: list[BaseException]) -> None:
    """Run run until stop is set (a background thread's loop); an exception ends it, kept in errors."""
    try:
        drv.current()
        while not stop.is_set():
            run()
    except BaseException as exc:  # noqa: BLE001 - the caller raises it
        errors.append(exc)


def latency(rig: Rig, seconds: float, fields: dict[str, int]) -> list[tuple[str, str, list[float]]]:
    """Another stream's 64 KiB pinned copy (copy + cuStreamSynchronize of that stream), timed over and over
    on this thread while another thread runs 1 GiB copies on rig's stream: none (idle), cudacore's staged
    pageable copy (staging set to fields), the driver's pageable copy, a pinned copy (the link busy with one
    DMA). Microseconds."""
    from cudacore._copy import staging_tuning

    staging_tuning(0, **(fields or {"chunk": 0}))
    drv = rig.drv
    big = min(1024 * MiB, rig.dbuf.size)
    s2 = rig.dev.create_stream()
    raw2 = drv.stream(s2.handle)
    small_dev = rig.dev.allocate(64 << 10, stream=s2)
    small_pin = rig.dev.allocate_pinned(64 << 10)
    out: list[tuple[str, str, list[float]]] = []
    try:
        for to_device in (True, False):
            move = small_dev.copy_from if to_device else small_dev.copy_to
            direction = "H2D" if to_device else "D2H"
            for how in ("idle", "cudacore", "driver", "pinned"):
                stop = threading.Event()
                errors: list[BaseException] = []
                background = None
                if how != "idle":
                    run = rig.copy(big, to_device, how)
                    run()  # warm (the staging buffers allocated)
                    background = threading.Thread(target=repeat, args=(drv, run, stop, errors), daemon=True)
                    background.start()
                    time.sleep(0.05)  # the big copies are under way
                samples: list[float] = []
                t_end = time.perf_counter() + seconds
                while time.perf_counter() < t_end:
                    t0 = time.perf_counter()
                    move(small_pin, stream=s2)
                    drv.sync(raw2)
                    samples.append((time.perf_counter() - t0) * 1e6)
                    time.sleep(0.0002)  # spread the samples over the big copies' phases
                stop.set()
                if background is not None:
                    background.join()
                if errors:
                    raise errors[0]
                out.append((direction, how, samples))
    finally:
        s2.synchronize()
        small_dev.close()
        small_pin.close()
        s2.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fmt(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= MiB else f"{n >> 10} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the sweep (default 5)")
    ap.add_argument("--quick", action="store_true", help="3 rounds at 16 MiB and 256 MiB")
    ap.add_argument("--settings", default="", help="comma-separated names of SETTINGS to sweep (default: all)")
    ap.add_argument("--latency-seconds", type=float, default=0.6, help="time per phase of the latency test")
    ap.add_argument("--latency-setting", default="default",
                    help="comma-separated settings cudacore's copy runs with in the latency test (the first is judged)")
    args = ap.parse_args()
    sizes = [16 * MiB, 256 * MiB] if args.quick else SIZES
    rounds = 3 if args.quick else args.rounds
    settings = SETTINGS
    if args.settings:
        wanted = [x.strip() for x in args.settings.split(",")]
        names = [name for name, _ in SETTINGS]
        if unknown := [w for w in wanted if w not in names]:
            ap.error(f"unknown setting(s) {unknown}; choose among {names}")
        settings = [s for s in SETTINGS if s[0] in wanted]
        if "default" not in wanted:
            settings = [SETTINGS[0], *settings]
    latency_names = [x.strip() for x in args.latency_setting.split(",")]
    if unknown := [x for x in latency_names if x not in dict(SETTINGS)]:
        ap.error(f"unknown --latency-setting {unknown}; choose among {[name for name, _ in SETTINGS]}")

    import numpy as np

    import cudacore as cc
    from cudacore._copy import staging_tuning

    started = time.perf_counter()
    drv = Driver()
    d = cc.Device(0)
    print(f"# cudacore {cc.__version__} from {os.path.dirname(cc.__file__)} on {cc.backend()}: {d.name}")
    print(f"# CPU {cpu_model()}, {os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable; numpy {np.__version__}; "
          f"Python {sys.version.split()[0]}")
    print(f"# default staging: {staging_tuning(0)}; {rounds} rounds, interleaved; medians in GB/s")
    rig = Rig(cc, np, drv, max(sizes))
    try:
        res = sweep(rig, sizes, rounds, settings)
        res.update(small_rows(rig, rounds))
        lats = [(name, latency(rig, args.latency_seconds, dict(SETTINGS)[name])) for name in latency_names]
    finally:
        staging_tuning(0, chunk=0)
        rig.close()

    med = {k: statistics.median(v) for k, v in res.items()}
    for to_device in (True, False):
        direction = "host to device" if to_device else "device to host"
        print(f"\n## {direction} (GB/s; x: against the driver's pageable copy)")
        print(f"{'contender':<16}" + "".join(f"{fmt(n):>18}" for n in sizes))
        for name in [s[0] for s in settings] + ["driver", "pinned"]:
            cells = []
            for n in sizes:
                v, base = med[(name, to_device, n)], med[("driver", to_device, n)]
                cells.append(f"{v:7.1f} ({v / base:4.1f}x)" if name != "driver" else f"{v:7.1f}       ")
            print(f"{name:<16}" + "".join(f"{c:>18}" for c in cells))

    print(f"\n## {fmt(SMALL)} (below the staging bound), GB/s")
    for to_device in (True, False):
        a, b = med[("cudacore", to_device, SMALL)], med[("driver", to_device, SMALL)]
        print(f"{'H2D' if to_device else 'D2H'}: cudacore {a:6.2f}  driver {b:6.2f}  ratio {a / b:.2f}")

    lat_med: dict[tuple[str, str], float] = {}
    for k, (setting, lat) in enumerate(lats):
        print(f"\n## another stream's 64 KiB pinned copy while a 1 GiB copy runs (cudacore: {setting}), "
              "us (median / p90 / max, samples)")
        for direction, how, samples in lat:
            if k == 0:
                lat_med[(direction, how)] = statistics.median(samples)
            print(f"{direction} during {how:<9} {statistics.median(samples):8.1f} {pct(samples, 0.9):8.1f} "
                  f"{max(samples):8.1f}   ({len(samples)})")

    print("\n## targets (default setting)")
    verdicts = []

    def verdict(what: str, ok: bool) -> None:
        verdicts.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {what}")

    for n in sizes:
        if n >= 64 * MiB:
            h, t = med[("default", True, n)], med[("default", False, n)]
            verdict(f"{fmt(n)} host to device {h:.1f} GB/s >= 40", h >= 40)
            verdict(f"{fmt(n)} device to host {t:.1f} GB/s >= 35", t >= 35)
    if 16 * MiB in sizes:
        for to_device in (True, False):
            v, b = med[("default", to_device, 16 * MiB)], med[("driver", to_device, 16 * MiB)]
            verdict(f"16 MiB {'H2D' if to_device else 'D2H'} {v / b:.2f}x the driver >= 2x", v >= 2 * b)
    for to_device in (True, False):
        a, b = med[("cudacore", to_device, SMALL)], med[("driver", to_device, SMALL)]
        verdict(f"{fmt(SMALL)} {'H2D' if to_device else 'D2H'} {a / b:.2f}x the driver >= 0.95x", a >= 0.95 * b)
    for direction in ("H2D", "D2H"):
        c, dr = lat_med[(direction, "cudacore")], lat_med[(direction, "driver")]
        verdict(f"{direction} another stream's copy {c:.0f} us during cudacore's copy <= {dr:.0f} us during the driver's", c <= dr)
    print(f"# {sum(verdicts)}/{len(verdicts)} targets met; {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One pool for every library (issue 32): cudacore.share_pool against each library's own pool.

One run prints one table for the issue's targets:

- allocation cost: microseconds per alloc+free pair of each library on the shared pool against its own
  native async path (PyTorch's ``cudaMallocAsync`` backend, CuPy's ``MemoryAsyncPool`` and RMM's
  ``CudaAsyncMemoryResource`` on their own pools, cudacore's allocator on the default pool), in one
  process, every contender measured in every round, interleaved (a round shares the pool, measures each
  library, undoes it and measures each again, alternating which comes first), medians over the rounds and
  their ratio (target: shared <= 1.05x own);
- peak reserved memory of one mixed workload (PyTorch training steps with ``cudnn.benchmark``, CuPy
  arrays, RMM buffers and cudacore buffers, in turns), once with the shared pool and once with each
  library's own pool (PyTorch's caching allocator, CuPy's memory pool, RMM's ``CudaAsyncMemoryResource``),
  each in a fresh interpreter: the device's used memory above what it was once every library had started,
  at its highest over the workload (target: shared <= 0.8x own);
- attribution: the share of the shared pool's use that ``memory_stats()["by_library"]`` names, at its
  least over the workload's phases, and in the verdict of a PyTorch out-of-memory error in the pool
  (``cc.explain_oom``): counted (each library's own count) and named (with the one library taken by
  difference) (target: >= 95%).

    python bench/one_pool.py             # on the GPU machine
    python bench/one_pool.py --sim       # smoke test on the simulator: a stand-in library (the simulator's
                                         # allocation from the current pool) for PyTorch, CuPy and RMM

Libraries that are not installed are reported as skipped, as are, on the simulator, all but cudacore and
the stand-in. The figures of --sim time host code, not a GPU: they only show that every row runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
HERE = os.path.abspath(__file__)
LIBRARIES = ("torch", "cupy", "rmm")


def fmt_bytes(n: float) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n:.0f} B"


def library(name: str) -> tuple[Any, str]:
    """The library imported, or None and why not ("skipped: ...")."""
    if importlib.util.find_spec(name) is None:
        return None, "skipped: not installed"
    try:
        return importlib.import_module(name), ""
    except Exception as e:  # noqa: BLE001 - a library that cannot load here is reported, not fatal
        return None, f"skipped: import failed: {type(e).__name__}: {e}"


# -- allocation cost ------------------------------------------------------------------------------------------


def _pairs(alloc: Callable[[], Any], free: Callable[[Any], None], pairs: int) -> float:
    """Microseconds per alloc+free pair, after a warm-up (a new pool reserves on its first allocations)."""
    for _ in range(max(8, pairs // 10)):
        free(alloc())
    t = time.perf_counter_ns()
    for _ in range(pairs):
        free(alloc())
    return (time.perf_counter_ns() - t) / pairs / 1000


def _drop(_: Any) -> None:
    """Free by dropping the last reference (a tensor, an array, a DeviceBuffer)."""


def cost_rows(sim: bool, rounds: int, pairs: int, size: int) -> list[str]:
    """Each library's alloc+free pair on the shared pool and on its own, interleaved over rounds."""
    if not sim:
        # PyTorch's own async path is its cudaMallocAsync backend on its own (the default) pool; it is
        # chosen at import, so this process imports torch with it, and sharing then makes the shared pool
        # the current one, which that backend allocates from.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    import cudacore as cc
    from cudacore._api import core

    d = cc.Device(0)
    ours: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "cudacore": (lambda: d.allocate(size), lambda b: b.close()),
    }
    skipped: dict[str, str] = {}
    wire: list[str] = []
    if sim:
        # A library allocating natively from the device's current pool, as PyTorch's and CuPy's async
        # allocators do (the simulator's cuMemAllocAsync on the legacy stream).
        ours["stand-in (current pool)"] = (lambda: core.SimPoolAllocate(0, size, 0), lambda p: core.SimPoolFree(0, p))
        for name in LIBRARIES:
            skipped[name] = "skipped: the simulator runs no library but cudacore and the stand-in"
    else:
        torch, why = library("torch")
        if torch is not None:
            torch.zeros(1, device="cuda")
            ours["torch"] = (lambda: torch.empty(size, dtype=torch.uint8, device="cuda"), _drop)
            wire.append("torch")
        else:
            skipped["torch"] = why
        cupy, why = library("cupy")
        if cupy is not None:
            # CuPy's own async path: MemoryAsyncPool on the current pool, which is the default pool until
            # the pool is shared (undo puts this allocator back).
            cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool("current").malloc)
            ours["cupy"] = (lambda: cupy.empty(size, dtype=cupy.uint8), _drop)
            wire.append("cupy")
        else:
            skipped["cupy"] = why
        rmm, why = library("rmm")
        if rmm is not None:
            rmm.mr.set_per_device_resource(0, rmm.mr.CudaAsyncMemoryResource())
            ours["rmm"] = (lambda: rmm.DeviceBuffer(size=size), _drop)
            wire.append("rmm")
        else:
            skipped["rmm"] = why

    samples: dict[tuple[str, str], list[float]] = {(name, mode): [] for name in ours for mode in ("shared", "own")}

    def measure(mode: str) -> None:
        for name, (alloc, free) in ours.items():
            samples[name, mode].append(_pairs(alloc, free, pairs))

    for i in range(rounds):
        for mode in (("shared", "own") if i % 2 == 0 else ("own", "shared")):
            if mode == "shared":
                sp = cc.share_pool(0, libraries=wire)
                measure("shared")
                d.synchronize()
                sp.undo()
            else:
                measure("own")
    rows = [f"allocation, us per alloc+free pair of {fmt_bytes(size)} (median of {rounds} rounds; target: shared <= 1.05x own)",
            f"  {'library':<28}{'shared':>10}{'own':>10}{'ratio':>9}"]
    for name in ours:
        shared, own = statistics.median(samples[name, "shared"]), statistics.median(samples[name, "own"])
        rows.append(f"  {name:<28}{shared:>10.2f}{own:>10.2f}{shared / own:>8.2f}x")
    rows += [f"  {name:<28}{why}" for name, why in skipped.items()]
    return rows


# -- the mixed workload, in a fresh interpreter per configuration ---------------------------------------------


def _worker(kind: str, sim: bool, rounds: int, threshold: int | None = None) -> None:
    """Runs one configuration's workload and prints ``RESULT <json>``."""
    if kind == "oom":
        out = _oom_sim() if sim else _oom_gpu()
    elif sim:
        out = _workload_sim(kind == "shared", rounds)
    else:
        out = _workload_gpu(kind == "shared", rounds, threshold)
    print("RESULT " + json.dumps(out))


def _attribution(by: dict[str, int], used: int) -> tuple[float, float]:
    """(counted, named): the shares of ``used`` that the libraries' own counts, and all named rows, cover."""
    if used == 0:
        return 1.0, 1.0
    named = sum(n for name, n in by.items() if name != "unattributed")
    counted = sum(n for name, n in by.items() if name != "unattributed" and not name.endswith(" (by difference)"))
    return min(counted / used, 1.0), min(named / used, 1.0)


class _Sampler:
    """The device's used memory (total - free) at each phase of the workload, and with a shared pool the
    attribution of the pool's use."""

    def __init__(self, shared: bool) -> None:
        import cudacore as cc

        self.d, self.shared = cc.Device(0), shared
        self.baseline = self.used()
        self.phases: list[dict[str, Any]] = []

    def used(self) -> int:
        free, total = self.d.memory_info()
        return total - free

    def sample(self, phase: str) -> None:
        row: dict[str, Any] = {"phase": phase, "above_baseline": self.used() - self.baseline}
        if self.shared:
            stats = self.d.memory_stats()
            row["counted"], row["named"] = _attribution(stats["by_library"], stats["pool_used"])
        self.phases.append(row)

    def result(self, libraries: list[str]) -> dict[str, Any]:
        peak = max(self.phases, key=lambda r: r["above_baseline"])
        out: dict[str, Any] = {"libraries": libraries, "peak": peak["above_baseline"], "peak_phase": peak["phase"], "phases": self.phases}
        if self.shared:
            out["counted"] = min(r["counted"] for r in self.phases)
            out["named"] = min(r["named"] for r in self.phases)
        return out


def _workload_gpu(shared: bool, rounds: int, threshold: int | None = None) -> dict[str, Any]:
    import cudacore as cc

    if shared:
        # Before importing torch: PyTorch picks its allocator backend at import.
        cc.share_pool(0, release_threshold=threshold)
    libraries = ["cudacore"]
    torch, _ = library("torch")
    cupy, _ = library("cupy")
    rmm, _ = library("rmm")
    libraries += [name for name, lib in (("torch", torch), ("cupy", cupy), ("rmm", rmm)) if lib is not None]
    if rmm is not None and not shared:
        rmm.mr.set_per_device_resource(0, rmm.mr.CudaAsyncMemoryResource())
    d = cc.Device(0)
    # Every library started (contexts, handles) before the baseline.
    d.allocate(MiB).close()
    model: Any = None
    opt: Any = None
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        torch.manual_seed(0)
        nn = torch.nn
        model = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU(), nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
        ).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    if cupy is not None:
        cupy.zeros(1)
    if rmm is not None:
        rmm.DeviceBuffer(size=1)
    sampler = _Sampler(shared)
    for _ in range(rounds):
        if torch is not None:
            for _ in range(4):
                x = torch.randn(64, 3, 160, 160, device="cuda")
                y = torch.randint(0, 10, (64,), device="cuda")
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            del x, y, loss
            torch.cuda.synchronize()
            sampler.sample("torch training")
        if cupy is not None:
            arrays = [cupy.ones(64 * MiB, dtype=cupy.float32) for _ in range(3)]  # 768 MiB
            total = float(sum(float(a.sum()) for a in arrays))
            assert total == 3 * 64 * MiB
            cupy.cuda.get_current_stream().synchronize()
            sampler.sample("cupy arrays")
            del arrays
        if rmm is not None:
            bufs = [rmm.DeviceBuffer(size=256 * MiB) for _ in range(2)]
            sampler.sample("rmm buffers")
            del bufs
        held = [d.allocate(256 * MiB) for _ in range(2)]
        sampler.sample("cudacore buffers")
        for b in held:
            b.close()
        d.synchronize()
    return sampler.result(libraries)


def _workload_sim(shared: bool, rounds: int) -> dict[str, Any]:
    import cudacore as cc
    from cudacore._api import core

    d = cc.Device(0)
    if shared:
        sp = cc.share_pool(0, libraries=[])
        sp.track("stand-in")  # allocates from the pool and counts nothing, as PyTorch and CuPy
    sampler = _Sampler(shared)
    for _ in range(rounds):
        blocks = [core.SimPoolAllocate(0, 8 * MiB, 0) for _ in range(4)]
        sampler.sample("stand-in blocks")
        for p in blocks:
            core.SimPoolFree(0, p)
        held = [d.allocate(8 * MiB) for _ in range(4)]
        sampler.sample("cudacore buffers")
        for b in held:
            b.close()
        d.synchronize()
    return sampler.result(["cudacore", "stand-in"])


def _oom_gpu() -> dict[str, Any]:
    """PyTorch, CuPy, RMM and cudacore in a pool with a maximum size; PyTorch runs out; the verdict's split."""
    import cudacore as cc

    d = cc.Device(0)
    cc.share_pool(0, max_size=4 << 30)  # before importing torch
    torch, why = library("torch")
    if torch is None:
        return {"skipped": why.replace("skipped: ", "skipped: torch ")}
    held: list[Any] = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda"), d.allocate(256 * MiB)]
    libraries = ["torch", "cudacore"]
    cupy, _ = library("cupy")
    if cupy is not None:
        held.append(cupy.zeros(512 * MiB, dtype=cupy.uint8))
        libraries.append("cupy")
    rmm, _ = library("rmm")
    if rmm is not None:
        held.append(rmm.DeviceBuffer(size=512 * MiB))
        libraries.append("rmm")
    torch.cuda.synchronize()
    used = d.memory_stats()["pool_used"]
    try:
        torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
        return {"skipped": "no out-of-memory error past the pool's maximum size"}
    except torch.OutOfMemoryError as e:
        err = cc.explain_oom(e)
    counted, named = _attribution(err.by_library, used)
    held[1].close()
    return {"libraries": libraries, "cause": err.cause, "by_library": err.by_library, "used": used, "counted": counted, "named": named}


def _oom_sim() -> dict[str, Any]:
    """The stand-in runs out of the pool's maximum size; its error explained."""
    import cudacore as cc
    from cudacore._api import core

    d = cc.Device(0)
    sp = cc.share_pool(0, max_size=64 * MiB, libraries=[])
    sp.track("stand-in")
    blocks = [core.SimPoolAllocate(0, 16 * MiB, 0) for _ in range(2)]
    buf = d.allocate(8 * MiB)
    used = d.memory_stats()["pool_used"]
    try:
        core.SimPoolAllocate(0, 48 * MiB, 0)
        return {"skipped": "no out-of-memory error past the pool's maximum size"}
    except cc.OutOfMemoryError as e:
        err = cc.explain_oom(e, requested=48 * MiB)  # the driver's error carries no size
    counted, named = _attribution(err.by_library, used)
    for p in blocks:
        core.SimPoolFree(0, p)
    buf.close()
    return {"libraries": ["stand-in", "cudacore"], "cause": err.cause, "by_library": err.by_library, "used": used,
            "counted": counted, "named": named}


def _run_worker(kind: str, sim: bool, rounds: int, threshold: int | None = None) -> dict[str, Any]:
    args = [sys.executable, HERE, "--worker", kind, "--rounds", str(rounds)] + (["--sim"] if sim else [])
    if threshold is not None:
        args += ["--release-threshold", str(threshold)]
    env = dict(os.environ)
    if sim:
        env["CUDACORE_BACKEND"] = "sim"
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900, check=False)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"the {kind} worker failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
    out: dict[str, Any] = json.loads(line[len("RESULT "):])
    return out


def _highest(result: dict[str, Any], phase: str) -> int:
    return max((r["above_baseline"] for r in result["phases"] if r["phase"] == phase), default=0)


def workload_rows(sim: bool, rounds: int, threshold: int | None = None) -> list[str]:
    shared, own = _run_worker("shared", sim, rounds, threshold), _run_worker("own", sim, rounds)
    oom = _run_worker("oom", sim, rounds)
    what = " + ".join(shared["libraries"])
    ratio = shared["peak"] / own["peak"] if own["peak"] else float("nan")
    kept = "all of it" if threshold is None else fmt_bytes(threshold)
    rows = ["peak reserved of one mixed workload, a fresh interpreter each (device used above the baseline; target: shared <= 0.8x own)",
            f"  the shared pool's release threshold: {kept}",
            f"  {'workload':<40}{'shared':>12}{'own':>12}{'ratio':>9}",
            f"  {what:<40}{fmt_bytes(shared['peak']):>12}{fmt_bytes(own['peak']):>12}{ratio:>8.2f}x",
            f"  {'':<40}at its peak: shared during {shared['peak_phase']!r}, own during {own['peak_phase']!r}",
            "  by phase, the highest (shared / own): " + ", ".join(
                f"{phase} {fmt_bytes(_highest(shared, phase))} / {fmt_bytes(_highest(own, phase))}"
                for phase in dict.fromkeys(r["phase"] for r in shared["phases"])),
            "attribution of the shared pool's use (counted: the libraries' own counts; named: with the one taken by difference; target: >= 95%)",
            f"  {'mixed workload, least over its phases':<40}counted {shared['counted']:6.1%}   named {shared['named']:6.1%}"]
    if "skipped" in oom:
        rows.append(f"  {'out-of-memory verdict':<40}{oom['skipped']}")
    else:
        split = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in oom["by_library"].items())
        rows.append(f"  {'out-of-memory verdict (' + oom['libraries'][0] + ')':<40}counted {oom['counted']:6.1%}   named {oom['named']:6.1%}"
                    f"   ({oom['cause']}; {split})")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="run on the simulator, with a stand-in library")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15, --sim 2); the workload's rounds")
    ap.add_argument("--pairs", type=int, default=None, help="alloc+free pairs per measurement (default 2000, --sim 50)")
    ap.add_argument("--size", type=int, default=MiB, help="bytes per allocation (default 1 MiB)")
    ap.add_argument("--release-threshold", type=int, default=None,
                    help="bytes the shared pool keeps reserved across a synchronize (default: share_pool's, all of it)")
    ap.add_argument("--worker", choices=("shared", "own", "oom"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sim:
        os.environ["CUDACORE_BACKEND"] = "sim"
    rounds = args.rounds or (2 if args.sim else 15)
    if args.worker:
        _worker(args.worker, args.sim, min(rounds, 3), args.release_threshold)
        return 0
    # The workers first: each starts its own interpreter, before this one has touched the device.
    rows = workload_rows(args.sim, min(rounds, 3), args.release_threshold)
    rows = cost_rows(args.sim, rounds, args.pairs or (50 if args.sim else 2000), args.size) + rows
    import cudacore as cc

    d = cc.Device(0)
    print(f"one pool (issue 32): cudacore.share_pool against each library's own pool; backend {cc.backend()}, device 0 ({d.name})")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

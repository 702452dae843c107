"""The peers' own test suites, run under cudacore and under each library's own allocator, compared test by
test (docs/contributing/gpu-testing.md, "The peers' own suites").

    python3 scripts/gpu/peer_suites.py [--suite cupy --suite torch --suite numba] [--out DIR]

On the GPU machine, with the wheel installed (scripts/gpu/run.sh does it) and the suites' sources fetched
on the development machine into ``peer-suites/`` (``scripts/fetch_peer_suites.sh``):

- **CuPy**: the tests of the CuPy source release matching the installed CuPy, with
  ``cupy.cuda.set_allocator(cudacore.interop.cupy_allocator())``;
- **PyTorch**: the allocator, stream, event and graph classes of ``test/test_cuda.py`` at a pinned commit,
  with ``cudacore.interop.use_torch_allocator()``;
- **Numba-CUDA**: modules of ``numba.cuda.tests`` of the installed numba-cuda, with
  ``NUMBA_CUDA_MEMORY_MANAGER=cudacore.interop``, run by unittest (``peer_unittest.py``), as Numba runs them.

Each selected file runs in a process of its own, once per allocator. A process that dies (a crash) has its
test recorded as ``crashed``, and the file goes on from there with the crashed tests deselected. The
table gives, per suite and allocator, the tests selected, passed, failed, skipped and crashed, then every
test whose outcome differs between the two allocators. Tests left out are listed in LEFT_OUT, each with
its reason. The exit status is 1 when any test crashed or any outcome differs.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES_DIR = ROOT / "peer-suites"
PLUGIN_DIR = Path(__file__).resolve().parent

#: Per suite: the files (or packages) run, relative to the suite's root.
SELECTED = {
    "cupy": [
        "tests/cupy_tests/cuda_tests/test_stream.py",
        "tests/cupy_tests/cuda_tests/test_graph.py",
        "tests/cupy_tests/cuda_tests/test_memory.py",
        "tests/cupy_tests/cuda_tests/test_pinned_memory.py",
        "tests/cupy_tests/cuda_tests/test_device.py",
        "tests/cupy_tests/cuda_tests/test_cufft.py",
        "tests/cupy_tests/core_tests/test_ndarray.py",
        "tests/cupy_tests/core_tests/test_dlpack.py",
        "tests/cupy_tests/core_tests/test_ndarray_cuda_array_interface.py",
        "tests/cupy_tests/core_tests/test_multithreading.py",
        "tests/cupy_tests/core_tests/test_ndarray_get.py",
        "tests/cupy_tests/core_tests/test_raw.py",
        "tests/cupy_tests/core_tests/test_elementwise.py",
        "tests/cupy_tests/creation_tests/test_from_data.py",
    ],
    "torch": ["test_cuda.py"],
    "numba": [
        "numba.cuda.tests.cudadrv.test_cuda_memory",
        "numba.cuda.tests.cudadrv.test_cuda_driver",
        "numba.cuda.tests.cudadrv.test_events",
        "numba.cuda.tests.cudadrv.test_context_stack",
        "numba.cuda.tests.cudapy.test_array",
        "numba.cuda.tests.cudapy.test_ipc",
        "numba.cuda.tests.cudapy.test_stream_api",
        "numba.cuda.tests.cudapy.test_sync",
        "numba.cuda.tests.cudapy.test_cuda_array_interface",
        # two GPUs (they skip with one): contexts and arrays of several devices, and threads
        "numba.cuda.tests.cudapy.test_multigpu",
        "numba.cuda.tests.cudadrv.test_select_device",
        "numba.cuda.tests.cudapy.test_multithreads",
    ],
}

#: Per suite: (pytest -k or nodeid pattern, reason) left out of both runs.
LEFT_OUT = {
    "cupy": [
        ("TestAllocator", "replaces the allocator itself (set_allocator) and checks CuPy's pool receives the allocations"),
        ("TestAllocatorDisabled", "replaces the allocator itself (set_allocator(None)) and checks CuPy's refusal"),
        ("TestPythonFunctionAllocator", "replaces the allocator itself with a Python function and counts its calls"),
        ("TestMallocAsync", "replaces the allocator itself (set_allocator(malloc_async))"),
        ("TestMemoryAsyncPool", "tests CuPy's MemoryAsyncPool internals (its own pool object)"),
        ("TestSingleDeviceMemoryPool", "tests the internals of CuPy's own MemoryPool (its arenas, chunk sizes, limits)"),
        ("TestMemoryPool", "tests the internals of CuPy's own MemoryPool (its free lists and statistics)"),
        ("TestParseMempoolLimitEnvVar", "tests CuPy's own pool's environment variable"),
        ("test_thread_safe", "TestDeviceSwitch::test_thread_safe hangs under CuPy's own allocator too (H200, one GPU)"),
        (
            "jitify",
            (
                "the NVRTC (jitify) variants of test_raw compile for minutes: cut by the timeout (470 s) under CuPy's "
                "own allocator too (H200); they test the compiler's front end, not memory or streams"
            ),
        ),
    ],
    "torch": [
        (
            (
                "test_memory_stats or test_memory_snapshot or test_caching_allocator or test_allocator_settings or "
                "test_set_per_process_memory_fraction or test_cudart_register or test_memory_plots or "
                "test_cuda_memory_leak_detection or test_max_split or test_expandable or test_garbage_collect or "
                "test_mempool or test_graph_pool or test_memory_allocation or test_release or test_empty_cache or "
                "test_host_memory or test_record_stream or test_allocator_backend or test_notifies_oom or "
                "test_oom or test_out_of_memory"
            ),
            (
                "tests PyTorch's own caching allocator: its statistics, snapshots, settings, pools, host allocator "
                "and out-of-memory path, which a pluggable allocator replaces (PyTorch refuses several of these "
                "calls under any CUDAPluggableAllocator)"
            ),
        ),
        ("TestCudaMallocAsync or TestMemPool or TestBlockStateAbsorption",
         "classes that test PyTorch's own allocator backends and pools"),
        (
            "test_graph_rng_after_failed_capture or test_graph_rng_concurrent_captures or test_graphsafe_set_get_rng_state",
            (
                "test fixes newer than the installed torch (the pinned file is from PyTorch's main): each fails under "
                "PyTorch's own allocator too, in a fresh process, and leaves a capture or the CUDA generator "
                "mid-capture, so that every later test fails (H200, torch 2.11.0)"
            ),
        ),
    ],
    "numba": [
        ("test_emm_plugins", "replaces the memory manager itself"),
        ("test_deallocations", "tests the pending-deallocation queue of Numba's own memory manager"),
    ],
}

#: Per suite: (test id pattern, outcome under the own allocator, under cudacore, reason): differences that
#: are the suites' own design or a documented limit, reported but not counted as failures. A listed test
#: that differs in any other way still counts.
EXPECTED = {
    "cupy": [],
    "torch": [
        *(
            (name, "passed", "failed", f"PyTorch refuses {call} under any CUDAPluggableAllocator (the pool issue)")
            for name, call in (
                ("test_cublas_workspace_explicit_allocation", "getDeviceStats (memory_stats)"),
                ("test_graph_memory_stats_and_use_result_after_destroy_graph", "getDeviceStats (memory_stats)"),
                ("test_cuda_graph_allocator_propagates_stream", "snapshot (memory_snapshot)"),
                ("test_get_per_process_memory_fraction", "getMemoryFraction"),
                ("test_matmul_memory_use", "getDeviceStats (max_memory_allocated)"),
                ("test_autocast_cache_leak", "getDeviceStats (memory_allocated)"),
                ("test_graph_two_successive", "getDeviceStats (memory_stats)"),
                ("test_randint_generation_for_large_numel", "getMemoryFraction"),
            )
        ),
        *(
            (
                name,
                "passed",
                "failed",
                (
                    "memory allocated in a capture is the graph's (a stream-ordered allocation node): it is usable once "
                    "the graph has launched, and no other graph shares it. PyTorch's own cudaMallocAsync backend does "
                    "the same, and this test skips these checks for it (TEST_CUDAMALLOCASYNC); it asserts the "
                    f"native pool's behaviour: {what}"
                ),
            )
            for name, what in (
                ("test_graph_rng_distributions", "reading a captured output before the first replay"),
                ("test_graph_three_successive", "graphs sharing a pool overwrite each other's outputs"),
            )
        ),
        (
            "test_graph_concurrent_replay",
            "passed",
            "failed",
            (
                "asserts that PyTorch's native allocator, with graphs sharing a pool, corrupts concurrent replays; "
                "on cudacore the results are right, as the test expects of PyTorch's cudaMallocAsync backend"
            ),
        ),
    ],
    "numba": [
        (
            "test_cuda_array_interface.TestCudaArrayInterface.test_ownership",
            "*",
            "skipped",
            "Numba skips it under any external memory manager (skip_if_external_memmgr)",
        ),
        (
            "test_ipc.TestIpc",
            "*",
            "*",
            (
                "Numba's IPC needs cuIpcGetMemHandle, which blocks of a stream-ordered pool do not have: cudacore's "
                "plug-in raises NotSupportedError naming CUDACORE_ALLOCATOR=sync (docs/guide/memory.md, Numba)"
            ),
        ),
    ],
}


def expected(suite: str, nodeid: str, own: str, ours: str) -> str | None:
    """The reason a difference is expected, or None."""
    for pattern, a, b, reason in EXPECTED[suite]:
        if pattern in nodeid and a in ("*", own) and b in ("*", ours):
            return reason
    return None


TORCH_CLASSES = "TestCuda or TestCudaMultiGPU or TestCudaOptims or TestCudaComm or TestCudaAutocast or TestCudaGraph"


def suite_root(suite: str) -> Path:
    if suite == "cupy":
        import cupy

        root = SUITES_DIR / f"cupy-{cupy.__version__}"
        if not (root / "tests").is_dir():
            sys.exit(f"no CuPy {cupy.__version__} tests in {root}: run scripts/fetch_peer_suites.sh on the development machine")
        return root
    if suite == "torch":
        root = SUITES_DIR / "torch"
        if not (root / "test_cuda.py").is_file():
            sys.exit(f"no test_cuda.py in {root}: see scripts/fetch_peer_suites.sh")
        return root
    return ROOT


def plugin_dir(out: Path) -> Path:
    """A folder holding peer_plugin.py alone, for the runs' PYTHONPATH: scripts/gpu itself has modules
    (profile.py) that would shadow the standard library's in the peers' processes."""
    d = out / "plugin"
    d.mkdir(parents=True, exist_ok=True)
    src, dst = PLUGIN_DIR / "peer_plugin.py", d / "peer_plugin.py"
    if not dst.exists() or dst.read_bytes() != src.read_bytes():  # the lanes of --split-gpus read it at once
        shutil.copyfile(src, dst)
    return d


#: allocator -> the GPU its processes see (CUDA_VISIBLE_DEVICES), with --split-gpus; empty: all GPUs, and
#: the two allocators take turns.
GPU_OF: dict[str, str] = {}

#: time.monotonic() after which no process starts and a running one is stopped (--deadline); None: none.
DEADLINE: float | None = None
#: A pytest marker expression (-m) the pytest suites run under, or None for all their tests.
MARK: str | None = None
#: A pytest keyword expression (-k) the pytest suites' selection is narrowed by (--keyword), or None.
KEYWORD: str | None = None


def time_left(timeout: float) -> float:
    """A process's timeout: ``timeout``, cut to what is left before the deadline (0: start nothing)."""
    return timeout if DEADLINE is None else max(0.0, min(timeout, DEADLINE - time.monotonic()))


def test_sites(suite: str, out: Path) -> list[str]:
    """The folders put first on a suite's PYTHONPATH: peer_plugin.py's, and the suites' test-only
    dependencies from peer-suites/wheels (installed there once, without an index); the Numba runs get the
    older numpy their tests need as well."""
    sites = [str(plugin_dir(out))]
    wheels = sorted((SUITES_DIR / "wheels").glob("*.whl"))
    for name, chosen in (
        ("site-numba", [w for w in wheels if w.name.startswith("numpy-")] if suite == "numba" else []),
        ("site", [w for w in wheels if not w.name.startswith("numpy-")]),
    ):
        if not chosen:
            continue
        site = out / name
        if not site.is_dir():
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), *map(str, chosen)]
            subprocess.run(cmd, check=True)
        sites.append(str(site))
    return sites


def run_file(suite: str, target: str, allocator: str, out: Path, timeout: float, jobs: int) -> dict[str, str]:
    """Run one file (or package) under one allocator, then each of its failures alone in a fresh process;
    return nodeid -> outcome, crashes included.

    A test that leaves the process's CUDA state broken (a capture left open, a sticky error) fails every
    test after it, under either allocator; PyTorch's own CI reruns failures in new processes for that
    reason. Here each failure runs again alone, ``jobs`` processes at a time, and keeps the outcome of
    that run: a test fails only when it fails on its own. ``jobs`` 0 skips the reruns."""
    outcomes = run_once(suite, target, allocator, out, timeout, [])
    pending = [n for n, o in outcomes.items() if o in ("failed", "error") and "::" in n]
    if suite == "numba" or not jobs or not pending or len(pending) == len(outcomes):
        return outcomes  # unittest ids, no reruns asked, or nothing ran at all
    print(f"  rerunning {len(pending)} failures, each alone, {jobs} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        runs = {n: pool.submit(run_once, suite, target, allocator, out, timeout, [f"{target}::{n.split('::', 1)[1]}"], i, True)
                for i, n in enumerate(pending, 1)}
        for n, fut in runs.items():
            got = fut.result().get(n)
            if got is not None:
                outcomes[n] = got
    counts = collections.Counter(outcomes[n] for n in pending)
    print(f"  alone: {dict(counts)}", flush=True)
    return outcomes


def run_once(
    suite: str, target: str, allocator: str, out: Path, timeout: float, nodeids: list[str], rerun: int = 0,
    quiet: bool = False,
) -> dict[str, str]:
    """One process (one more per crash) running ``target``, or only ``nodeids`` of it when given; ``quiet``
    prints only crashes (the reruns, which run side by side)."""
    root = suite_root(suite)
    name = target.replace("/", "_").replace(".", "_") + (f"-rerun{rerun}" if rerun else "")
    log = out / f"{suite}-{allocator}-{name}.log"
    log.unlink(missing_ok=True)
    transcript = log.with_suffix(".out")
    transcript.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        CUDACORE_PEER_ALLOCATOR=allocator,
        CUDACORE_PEER_SUITE=suite,
        CUDACORE_PEER_LOG=str(log),
        PYTHONPATH=os.pathsep.join(p for p in (*test_sites(suite, out), env.get("PYTHONPATH", "")) if p),
        PYTHONFAULTHANDLER="1",
    )
    if allocator in GPU_OF:
        env["CUDA_VISIBLE_DEVICES"] = GPU_OF[allocator]
        # CuPy's multi-GPU tests skip by this count, not by the devices they see (they fail with an invalid
        # device ordinal when one GPU is visible).
        env["CUPY_TEST_GPU_LIMIT"] = "1"
    if suite == "numba" and allocator == "cudacore":
        env["NUMBA_CUDA_MEMORY_MANAGER"] = "cudacore.interop"
    deselect: list[str] = []
    outcomes: dict[str, str] = {}
    left = " or ".join(f"({k})" for k, _ in LEFT_OUT[suite])
    keyword = f"not ({left})" if left else ""
    if suite == "torch":
        keyword = f"({TORCH_CLASSES}) and {keyword}"
    if KEYWORD:
        keyword = f"({KEYWORD}) and {keyword}" if keyword else KEYWORD
    for _attempt in range(50):  # one more start per crash
        if suite == "numba":  # unittest suites: their own runner, which logs as the plugin does
            cmd = [sys.executable, str(PLUGIN_DIR / "peer_unittest.py"), target]
            for pattern, _ in LEFT_OUT[suite]:
                cmd += ["--skip", pattern]
            for d in deselect:
                cmd += ["--skip", d]
        else:
            # cudacore's own pytest plugin stays out: the peers' tests are not cudacore's.
            cmd = [sys.executable, "-m", "pytest", "-q", "-rN", "-p", "peer_plugin", "-p", "no:cacheprovider", "-p", "no:cudacore"]
            cmd += nodeids or [target]
            if keyword:
                cmd += ["-k", keyword]
            if MARK:
                cmd += ["-m", MARK]
            for d in deselect:
                cmd += ["--deselect", d]
        started = time.monotonic()
        if time_left(timeout) <= 0:
            print(f"  {suite}/{allocator} {target}: not started, past the deadline", flush=True)
            return outcomes
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=time_left(timeout), text=True, check=False)
            rc, text = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as e:
            rc, text = -9, e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout or "")
        tail = text[-3000:]
        with open(transcript, "a", encoding="utf-8") as f:  # the whole output, for reading failures later
            f.write(f"$ {' '.join(cmd)}\n{text}\n")
        pending = None
        for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
            kind, _, nodeid = line.partition(" ")
            if kind == "start":
                pending = nodeid
            else:
                outcomes[nodeid] = kind
                if nodeid == pending:
                    pending = None
        died = rc < 0 or rc >= 128 or (rc not in (0, 1, 5) and pending is not None)
        if not died:
            counts = collections.Counter(outcomes.values())
            if quiet:
                return outcomes
            print(f"  rc {rc}, {time.monotonic() - started:.0f}s: {dict(counts)}", flush=True)
            if rc not in (0, 1) or not outcomes or all(v == "error" for v in outcomes.values()):
                print(tail, flush=True)
            return outcomes
        if pending is None:
            print(f"  {suite}/{allocator} {target}: died (rc {rc}) outside a test\n{tail}", flush=True)
            outcomes[f"{target}::<collection or exit>"] = "crashed"
            return outcomes
        outcomes[pending] = "crashed" if rc != -9 else "timeout"
        print(f"  {suite}/{allocator}: {pending} {outcomes[pending]} (rc {rc})\n{tail[-1500:]}", flush=True)
        if rc == -9:
            return outcomes  # out of time for this file: the rest of it is not run
        deselect.append(pending)
        log.unlink(missing_ok=True)
    return outcomes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", choices=sorted(SELECTED), help="suite to run (repeat); default all")
    ap.add_argument("--only", action="append", help="run only the selected files containing this text (repeat)")
    ap.add_argument("--mark", help="pytest suites: run only the tests with this marker expression (-m), e.g. multi_gpu")
    ap.add_argument("--keyword", help="pytest suites: run only the selected tests matching this keyword expression "
                    "(-k, with the left-out tests still left out), e.g. TestCudaMultiGPU")
    ap.add_argument("--allocator", action="append", choices=["own", "cudacore"], help="default both")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    ap.add_argument("--timeout", type=float, default=600, help="seconds for one file's process")
    ap.add_argument("--jobs", type=int, default=8, help="failures rerun alone side by side (0: no reruns)")
    ap.add_argument("--deadline", type=float, help="seconds from now after which nothing more starts and a running "
                    "process is stopped; the table and the outcome files are still written")
    ap.add_argument("--tar", help="write the output folder into this .tar.gz at the end, however the run ends "
                    "(the device tool returns only a handful of files)")
    ap.add_argument("--split-gpus", action="store_true",
                    help="on a machine of two GPUs or more: run the two allocators at once, own on GPU 0 and cudacore "
                    "on GPU 1, each seeing only its own (a test that measures device memory then sees no other "
                    "process's; tests that need two GPUs skip under both, so run those without it)")
    args = ap.parse_args()
    if args.split_gpus:
        GPU_OF.update(own="0", cudacore="1")
    global DEADLINE, MARK, KEYWORD
    DEADLINE = None if args.deadline is None else time.monotonic() + args.deadline
    MARK = args.mark
    KEYWORD = args.keyword
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, out)
    finally:
        if args.tar:
            with tarfile.open(args.tar, "w:gz") as tar:  # the installed sites and the plugin copy left out
                tar.add(out, arcname=out.name, filter=lambda m: None if m.name.split("/")[1:2] in (["site"], ["site-numba"], ["plugin"]) else m)


def versions() -> str:
    """The versions the runs used, for the record: the peers and cudacore as installed, and Python."""
    import importlib.metadata as md
    import platform

    found = []
    for dist in ("cudacore", "torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "numba-cuda", "numba", "numpy", "cuda-python"):
        try:
            found.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join([*found, f"Python {platform.python_version()}"])


def run(args: argparse.Namespace, out: Path) -> int:
    """The runs, their differences and the table."""
    allocators = args.allocator or ["own", "cudacore"]
    print(f"versions: {versions()}", flush=True)
    status = 0
    rows = []
    for suite in args.suite or sorted(SELECTED):
        results: dict[str, dict[str, str]] = {a: {} for a in allocators}
        test_sites(suite, out)  # installed once, before lanes that would install them at once
        for target in SELECTED[suite]:
            if args.only and not any(o in target for o in args.only):
                continue
            got = {}
            with concurrent.futures.ThreadPoolExecutor(len(allocators) if GPU_OF else 1) as lanes:
                # interleaved per file; at once, on a GPU each, with --split-gpus
                futures = {}
                for allocator in allocators:
                    print(f"{suite} {allocator} {target}" + (f" (GPU {GPU_OF[allocator]})" if GPU_OF else ""), flush=True)
                    futures[allocator] = lanes.submit(run_file, suite, target, allocator, out, args.timeout, args.jobs)
                for allocator, fut in futures.items():
                    got[allocator] = fut.result()
                    results[allocator].update(got[allocator])
            if len(allocators) == 2:  # each file's differences as it ends: a run cut short still tells
                a, b = (got[x] for x in allocators)
                for n in sorted(n for n in set(a) | set(b) if a.get(n, "absent") != b.get(n, "absent")):
                    print(f"  DIFF {n}: {a.get(n, 'absent')} -> {b.get(n, 'absent')}", flush=True)
        for allocator in allocators:
            # Every test's outcome, for comparing runs made apart (each allocator on a machine of its own).
            (out / f"outcomes-{suite}-{allocator}.json").write_text(json.dumps(results[allocator], indent=1, sort_keys=True))
            counts = collections.Counter(results[allocator].values())
            rows.append((suite, allocator, len(results[allocator]), counts))
            if counts["crashed"] or counts["timeout"]:
                status = 1
        print(f"\n{suite}: left out (both allocators):")
        for pattern, reason in LEFT_OUT[suite]:
            print(f"  -k {pattern!r}: {reason}")
        if len(allocators) == 2:
            a, b = (results[x] for x in allocators)
            diff = sorted(n for n in set(a) | set(b) if a.get(n, "absent") != b.get(n, "absent"))
            known = {n: r for n in diff if allocators == ["own", "cudacore"] and (r := expected(suite, n, a.get(n, "absent"), b.get(n, "absent")))}
            print(f"{suite}: {len(diff) - len(known)} differences ({allocators[0]} -> {allocators[1]}), {len(known)} expected")
            for n in diff:
                why = f"  [expected: {known[n]}]" if n in known else ""
                print(f"  {n}: {a.get(n, 'absent')} -> {b.get(n, 'absent')}{why}")
            if len(diff) > len(known):
                status = 1
    print()
    print("| suite | allocator | tests | passed | failed | error | skipped | xfailed | crashed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for suite, allocator, n, c in rows:
        print(f"| {suite} | {allocator} | {n} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
              f"{c['xfailed'] + c['xpassed']} | {c['crashed'] + c['timeout']} |")
    return status


if __name__ == "__main__":
    sys.exit(main())

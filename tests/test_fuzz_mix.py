"""The fuzzer's ``all`` mix (tests/fuzz_mix.py) and the signal sweep (tests/signal_sweep.py) in the suite: a
sample of each, and the mix's own checks (a leaked descriptor or shared buffer fails a program).

Each runs in its own processes (the mix needs two simulated devices, fixed per process).
``CUDACORE_FUZZ_MIX_PROGRAMS`` (default 60) and ``CUDACORE_FUZZ_SEED`` set the mix's budget,
``CUDACORE_SIGNAL_STRIDE`` (default 12) the sweep's; the long runs are
``python tests/fuzz.py --mix all --programs 10000 --jobs 2`` and ``python tests/signal_sweep.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROGRAMS = int(os.environ.get("CUDACORE_FUZZ_MIX_PROGRAMS", "60"))
SEED = int(os.environ.get("CUDACORE_FUZZ_SEED", "0"))
STRIDE = int(os.environ.get("CUDACORE_SIGNAL_STRIDE", "12"))

pytestmark = pytest.mark.sim


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent / "python"), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _last_json(out: str) -> dict:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def test_the_mix_keeps_every_invariant(tmp_path: Path) -> None:
    cmd = [sys.executable, str(HERE / "fuzz.py"), "--mix", "all", "--programs", str(PROGRAMS), "--seed", str(SEED),
           "--jobs", "1", "--failures", str(tmp_path / "failures.jsonl")]  # fmt: skip
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    summary = _last_json(r.stdout)
    assert summary["failed_seeds"] == [], r.stderr[-6000:]
    assert summary["programs"] == PROGRAMS and summary["ops"] > 20 * PROGRAMS
    # The programs met what the mix adds: an interrupt delivered, children spawned, imports, peer copies...
    for what in ("signals", "spawns", "imports", "peer_copies", "graphed_calls", "rehearsals"):
        assert summary["mix"][what] > 0, f"no {what} in {PROGRAMS} programs: {summary['mix']}"


def test_every_operation_of_the_mix_is_drawn() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import fuzz, fuzz_mix
        fuzz.use_mix("all")
        ops = set()
        def walk(op):
            ops.add(op[0])
            body = op[-1]
            if isinstance(body, list):
                for x in body:
                    for y in (x if x and isinstance(x[0], list) else [x]):
                        walk(y)
        for seed in range(300):
            for op in fuzz.generate(seed):
                walk(op)
        print(sorted(set(fuzz_mix.TOP) - ops))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


_LEAKY = """
import os, sys
sys.path.insert(0, {here!r})
import fuzz, fuzz_mix
fuzz.use_mix("all")
import cudacore as cc
kept = []
def leak(st, *args):
    if {what!r} == "descriptor":
        kept.append(os.dup(0))
    else:
        kept.append(cc.Device(1).allocate_shareable(4096))
fuzz.Ops.op_shared = staticmethod(leak)
rec = fuzz.run_program(cc, 0, [["shared", 1, 2, 3, 4, 5, 6]])
print(rec["violations"])
"""


@pytest.mark.parametrize(("what", "words"), [("descriptor", "open descriptors"), ("shared", "device 1 shared_in_use")])
def test_a_leak_of_the_mix_is_a_violation(what: str, words: str) -> None:
    code = _LEAKY.format(here=str(HERE), what=what)
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert words in r.stdout, r.stdout


def test_the_signal_sweep_sample_loses_nothing() -> None:
    cmd = [sys.executable, str(HERE / "signal_sweep.py"), "--stride", str(STRIDE), "--seed", str(SEED)]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    counts = _last_json(r.stdout)
    assert counts["violations"] == 0, r.stderr[-6000:]
    assert counts["calls"] >= 25 and counts["signals"] > counts["calls"], counts
    assert counts["interrupted"] > 0, counts


def test_the_signal_sweep_sees_a_lost_descriptor() -> None:
    """The sweep's check can fail: a call that leaks a descriptor when interrupted is reported."""
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(HERE)!r})
        import signal_sweep
        real = signal_sweep._calls
        def calls(cc):
            def leaky(c, _):
                fd = os.dup(0)
                sum(range(3))  # a call: a point where the interrupt can come, the descriptor not yet owned
                os.close(fd)
            return {{**real(cc), "leaky": (lambda c: None, leaky)}}
        signal_sweep._calls = calls
        counts = signal_sweep.sweep(["leaky"])
        print(len(counts["violations"]), counts["signals"])
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    bad, signals = map(int, r.stdout.split())
    assert bad >= 1 and signals >= 2


def test_no_descriptor_window_and_no_lease_deadlock_under_ctrl_c() -> None:
    """Every position of the calls that make a descriptor (an export's duplicates and lease, the driver's
    pool descriptor, a received message's descriptors) loses none to a Ctrl-C, and
    an interrupted import never leaves the lease's thread lock held (its cleanup waited for good)."""
    fixed = ("export_pool", "export_ipc", "receive_handle")
    cmd = [sys.executable, str(HERE / "signal_sweep.py"), *(a for c in fixed for a in ("--call", c))]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    counts = _last_json(r.stdout)
    assert counts["violations"] == 0 and counts["known"] == {}, r.stderr[-6000:]
    assert counts["interrupted"] > 100, counts
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import signal_sweep
        counts = signal_sweep.sweep(["open_imported"])
        print(counts["runs"])
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-6000:]
    assert int(r.stdout.split()[-1]) > 50


def test_no_descriptor_lost_by_a_close_a_pickling_or_an_import_under_ctrl_c() -> None:
    """Every position of the closes that give descriptors back (a handle's, an import's lease, an exported
    SharedBuffer's lease), of a pickling of a SharedBuffer and of an import loses none to a Ctrl-C: a
    descriptor leaves its owner's list and is closed with interrupts held back in between
    (``_owner.uninterrupted``); the duplicates multiprocessing's resource sharer keeps for a pickling
    are taken back unless the pickler wrote them (``_ipc._Sharing``). 19 violations before (handle_close
    4, imported_close 2, shared_close_exported 2, open_imported 11: 7 in the sweep's own helper, 4 in the
    handle's close), and 48 of pickle_shared counted as known."""
    calls = ("handle_close", "imported_close", "shared_close_exported", "pickle_shared", "open_imported")
    cmd = [sys.executable, str(HERE / "signal_sweep.py"), *(a for c in calls for a in ("--call", c))]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    counts = _last_json(r.stdout)
    assert counts["violations"] == 0 and counts["known"] == {}, r.stderr[-6000:]
    assert counts["calls"] == len(calls) and counts["interrupted"] > 300, counts


_UNWRITTEN_PICKLE = """
import gc, os, pickle, sys
sys.path.insert(0, {here!r})
import fuzz_mix
from multiprocessing import resource_sharer
import cudacore as cc
sb = cc.Device(0).allocate_shareable(4096, kind="pool")
pickle.loads(pickle.dumps(sb)).close()  # warm: the pool's descriptor, the sharer's thread
h = sb.export()
before = (len(os.listdir("/proc/self/fd")), len(resource_sharer._resource_sharer._cache))
h.__reduce__()  # the duplicates registered, and never written: what an interrupted pickling leaves
gc.collect()
after = (len(os.listdir("/proc/self/fd")), len(resource_sharer._resource_sharer._cache))
data = pickle.dumps(sb)  # written: the sharer keeps them for the process that unpickles
kept = len(resource_sharer._resource_sharer._cache)
pickle.loads(data).close()
h.close()
sb.close()
print(before == after, kept, len(resource_sharer._resource_sharer._cache))
"""


def test_an_unwritten_pickling_of_a_handle_keeps_no_descriptor() -> None:
    """The cause of the pickled-handle leak: IpcHandle.__reduce__ registers duplicates of its descriptors
    with multiprocessing's resource sharer, which keeps them until a process unpickles them or this one
    exits; an interrupt after the registration dropped the only record of them. They are owned until
    the pickler writes them, and taken back when the owner is collected unwritten."""
    r = subprocess.run([sys.executable, "-c", _UNWRITTEN_PICKLE.format(here=str(HERE))], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "2", "0"], r.stdout


_HANDLER_ENTRY = """
import sys
sys.path.insert(0, {here!r})
import fuzz_mix
def g(fail):
    if fail:
        raise ValueError
def f(fail):
    try:
        g(fail)
    except ValueError:
        return "handled"
seen = []
for fail in (False, True):
    t = fuzz_mix.Tripper(1 << 30)
    sys.settrace(t)
    f(fail)
    sys.settrace(None)
    seen.append(t.seen)
print(*seen)
"""


def test_the_sweep_delivers_no_signal_where_python_checks_for_none() -> None:
    """A call that raised goes to its handler without a check for a signal, so the handler's first
    instruction is no position of the sweep (the end of g's call is one only where g returned); a trace
    function raising there made CPython 3.11 keep the frames alive for good (the pickled-handle 'leak',
    an IpcHandle held by a lost frame)."""
    r = subprocess.run([sys.executable, "-c", _HANDLER_ENTRY.format(here=str(HERE))], env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    returned, raised = map(int, r.stdout.split())
    assert raised == returned - 1, r.stdout


_INTERRUPTED_CLOSE = """
import sys
sys.path.insert(0, {here!r})
import fuzz, fuzz_mix
fuzz.use_mix("all")
import cudacore as cc
bad, fired = [], 0
for op in ("close_buf", "drop_buf"):
    for at in range(fuzz_mix.INTERRUPT_SPAN):
        before = fuzz_mix.COUNTS["signals"]
        program = [["alloc", 7, 0, 0, 0, 0, 0], ["cai", 0, 0, 0, 0, 0, 0], ["interrupt", at, 0, 0, 0, 0, 0, [[op, 0, 0, 0, 0, 0, 0]]]]
        rec = fuzz.run_program(cc, at, program)
        if fuzz_mix.COUNTS["signals"] == before:
            break  # past the operation's last signal check
        fired += 1
        bad += [f"{{op}} at {{at}}: {{v}}" for v in rec["violations"]]
print(fired)
print(bad)
"""


def test_an_interrupted_close_of_the_mix_keeps_its_buffer_on_the_books() -> None:
    """Seed 20261495 of the ``all`` mix ended with 256 B in use: a Ctrl-C in ``Ops._forget`` (a close or
    drop of a buffer with a view), after the buffer left the program's list and before it was closed or
    dropped, left it held by ``State.made`` alone, which the cleanup does not close: the fuzzer's own
    bookkeeping, not cudacore's. After an interrupt such a buffer goes back on the books. Every position
    of both operations, each a program checked as the mix checks it."""
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED_CLOSE.format(here=str(HERE))], env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-6000:]
    fired, bad = r.stdout.splitlines()[-2:]
    assert int(fired) > 10 and bad == "[]", r.stdout[-6000:]


_REPLAY_POSITIONS = """
import sys
sys.path.insert(0, {here!r})
import fuzz, fuzz_mix
fuzz.use_mix("all")
import cudacore as cc
made = []
class Tripper(fuzz_mix.Tripper):
    def __init__(self, at):
        super().__init__(at)
        made.append(self)
fuzz_mix.Tripper = Tripper
differ, fired = [], 0
for at in range(0, fuzz_mix.INTERRUPT_SPAN, 3):
    program = [["alloc", 7, 0, 0, 0, 0, 0], ["interrupt", at, 0, 0, 0, 0, 0, [["dlpack", 0, 5, 0, 0, 0, 0], ["close_buf", 0, 0, 0, 0, 0, 0]]]]
    where = []
    for verbose in (False, True):
        del made[:]
        fuzz.run_program(cc, at, program, verbose=verbose)
        where.append(made[0].where)
    if not where[0]:
        break  # past the operations' last signal check
    fired += 1
    if where[0] != where[1]:
        differ.append((at, where))
print(fired)
print(differ)
"""


def test_a_replay_interrupts_where_the_run_did() -> None:
    """``--replay`` (a program run verbosely) delivers each Ctrl-C of the mix at the point where the plain run
    (a worker's, ``--shrink``'s) delivered it. Before, it printed each interrupted operation while the
    trace function counted signal checks, each print one more, so seed 41000099 leaked in its replay
    (a DLPack tensor lost in from_dlpack) and not in its run, and ``--shrink`` found nothing to shrink."""
    r = subprocess.run([sys.executable, "-c", _REPLAY_POSITIONS.format(here=str(HERE))], env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-6000:]
    fired, differ = r.stdout.splitlines()[-2:]
    assert int(fired) > 10 and differ == "[]", r.stdout[-6000:]

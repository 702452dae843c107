"""The hot methods: Stream/Event synchronize and query, Graph.launch and Kernel.launch are methods of the C
bases (cudacore/native) that take the direct path when they may and otherwise call the general path, the
Python subclass's _synchronize, _query or _launch, with the same arguments. Whatever C does, the answer or
the error must be the general path's."""

# ruff: noqa: B023 - each lambda made in a loop is called by same() within the iteration that made it
from __future__ import annotations

import copy
import itertools
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

import cudacore as cc

from conftest import run_python

FILL_PTX = Path(__file__).parent / "kernels" / "fill.ptx"


def _outcome(f: Any) -> tuple[str, str]:
    try:
        return ("ok", repr(f()))
    except Exception as exc:  # noqa: BLE001 - any outcome is compared, the error types included
        return (type(exc).__name__, str(exc))


def _one_copy_graph(d: cc.Device, s: cc.Stream) -> tuple[Any, cc.Buffer, cc.PinnedBuffer]:
    buf = d.allocate(4096, stream=s)
    pinned = d.allocate_pinned(4096)
    with s.capture() as g:
        buf.copy_from(pinned, stream=s)
    return g, buf, pinned


@pytest.mark.sim
def test_every_argument_shape_answers_as_the_python_method(dev):
    """Positional and keyword arguments, duplicates, unknown keywords, keywords with an embedded NUL,
    subclasses, default and closed streams, odd grids and shared memory sizes: the C method's result
    or error (type and message) is the one of its general path."""
    s = dev.create_stream()
    e = s.record(cc.Event(dev, timing=False))
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(s)
    s.synchronize()
    assert g._exec != 0
    closed = dev.create_stream()
    closed.close()
    closed_event = cc.Event(dev)
    closed_event.close()
    legacy = cc.Stream.legacy(dev)

    class SubStream(cc.Stream):
        pass

    sub = SubStream(dev)
    m = dev.load_module(FILL_PTX)
    k = m.function("fill")
    k._direct = 1  # as if Go had launched it: the simulator's direct path never launches a kernel from C
    diffs = []

    def same(label: str, hot: Any, python: Any) -> None:
        a, b = _outcome(hot), _outcome(python)
        if a != b:
            diffs.append((label, a, b))

    for cls, name, objs in (("Stream", "synchronize", (s, closed, legacy, sub)), ("Stream", "query", (s, closed, legacy, sub)),
                            ("Event", "synchronize", (e, closed_event)), ("Event", "query", (e, closed_event))):  # fmt: skip
        for obj in objs:
            for args, kw in (((), {}), ((1,), {}), ((), {"x": 1}), ((), {"self": 1})):
                same(f"{cls}.{name}{args}{kw} on {obj!r}", lambda: getattr(obj, name)(*args, **kw),
                     lambda: getattr(getattr(cc, cls), "_" + name)(obj, *args, **kw))  # fmt: skip
    for v in (s, closed, legacy, sub, None, 0, s.handle, True, 1.5, "x", 2**70):
        for args, kw in (((v,), {}), ((), {"stream": v}), ((), {"stream\0": v}), ((v,), {"stream": v})):
            same(f"Graph.launch{args}{kw}", lambda: g.launch(*args, **kw), lambda: cc.Graph._launch(g, *args, **kw))
    same("Graph.launch(s, s)", lambda: g.launch(s, s), lambda: cc.Graph._launch(g, s, s))
    kargs = (buf, 1, 10)
    for grid, block, shared, stream in itertools.product((1, 0, -1, 2**32, True, 1.0, (1, 1)), (1, 0, 2**32, False),
                                                         (0, -1, True, 2**32, None), (s, None, legacy, sub, closed)):  # fmt: skip
        same(f"Kernel.launch({grid}, {block}, {shared}, {stream!r})", lambda: k.launch(grid, block, kargs, shared, stream),
             lambda: cc.Kernel._launch(k, grid, block, kargs, shared, stream))  # fmt: skip
    for a in (kargs, (buf, 1), (1.5, 1, 10), (buf, 2**40, 10), [buf, 1, 10], "abc", 5, None):
        for args, kw in (((1, 1, a, 0, s), {}), ((), {"grid": 1, "block": 1, "args": a, "shared_mem": 0, "stream": s}),
                         ((1, 1, a), {"stream": s}), ((1, 1, a, 0, s), {"stream": s}), ((1, 1, a, 0, s, 1), {}),
                         ((1, 1, a), {"stream": s, "foo": 1}), ((1, 1, a), {"stream\0x": s})):  # fmt: skip
            same(f"Kernel.launch{args}{kw}", lambda: k.launch(*args, **kw), lambda: cc.Kernel._launch(k, *args, **kw))
    assert not diffs, "\n".join(f"{label}\n  C:      {a}\n  Python: {b}" for label, a, b in diffs[:10])
    g.destroy(), buf.close(), pinned.close(), e.close(), s.close(), sub.close(), m.unload()


@pytest.mark.sim
def test_a_keyword_with_an_embedded_nul_is_no_parameter(dev):
    """Graph.launch(**{"stream\\0x": s}) is an unknown keyword: C must not read it as stream and launch."""
    s = dev.create_stream()
    g, buf, pinned = _one_copy_graph(dev, s)
    g.launch(s)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        g.launch(**{"stream\0x": s})
    g.destroy(), buf.close(), pinned.close(), s.close()


def test_a_stream_or_module_cannot_be_copied_into_a_second_owner(dev):
    """A copy of a Stream would own its driver stream too: closing (or collecting) one left the other's
    query and synchronize handing the driver a destroyed stream from C, which ends the process."""
    s = dev.create_stream()
    for dup in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            dup(s)
    s.close()
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.copy(s)
    for default in (cc.Stream.legacy(dev), cc.Stream.per_thread(dev)):
        again = pickle.loads(pickle.dumps(default))
        assert again == default and again.device is dev and not again._owned
        assert copy.copy(default) == default
    m = dev.load_module(FILL_PTX)
    for dup in (pickle.dumps, copy.copy):
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            dup(m)
    m.unload()


@pytest.mark.sim
def test_closing_a_stream_another_object_named_never_reaches_the_driver():
    """The process that lost its stream to a copy's close now raises instead of ending in the driver."""
    code = (
        "import cudacore as cc\n"
        "s = cc.Device(0).create_stream()\n"
        "try:\n"
        "    import copy; copy.copy(s)\n"
        "except TypeError:\n"
        "    pass\n"
        "s.close()\n"
        "for f in (s.query, s.synchronize):\n"
        "    try:\n"
        "        f()\n"
        "    except cc.CUDAError as e:\n"
        "        print(e.name)\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": "sim"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["CUDACORE_ERROR_CLOSED"] * 2


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_every_hot_method_refuses_in_a_forked_child():
    code = (
        "import os, cudacore as cc\n"
        "d = cc.Device(0)\n"
        "s = d.create_stream(); e = s.record(cc.Event(d, timing=False))\n"
        "buf = d.allocate(4096, stream=s); pinned = d.allocate_pinned(4096)\n"
        "with s.capture() as g:\n"
        "    buf.copy_from(pinned, stream=s)\n"
        "g.launch(s); s.synchronize()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import signal; signal.alarm(20)\n"
        "    calls = [s.synchronize, s.query, e.synchronize, e.query, lambda: g.launch(s), lambda: g.launch(stream=s),\n"
        "             cc.Stream.legacy(d).query]\n"
        "    bad = 0\n"
        "    for f in calls:\n"
        "        try:\n"
        "            f()\n"
        "            bad += 1\n"
        "        except cc.CUDAError as ex:\n"
        "            bad += not (ex.name == 'CUDACORE_ERROR_FORKED' and 'spawn' in str(ex))\n"
        "    os._exit(bad)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": os.environ.get("CUDACORE_BACKEND", "sim")}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "child 0"

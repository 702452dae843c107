"""cudacore.dask on the simulator: Dask's serializers for Buffers, the worker plugin, memory_report and an
out-of-memory error crossing from a worker to the client, on distributed's own LocalCluster.

The clusters run in fresh interpreters (tests/dask_workload.py): the simulated devices are fixed per
process, and the plugin changes CuPy's allocator for the whole process. CuPy there is a stand-in of its
allocator API (written below), since the simulator runs no kernels and CI has no CuPy.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import cudacore as cc

from conftest import run_python

distributed = pytest.importorskip("distributed", reason="cudacore.dask needs distributed (make venv installs it)")
from distributed.protocol import deserialize, serialize

import cudacore.dask as cdask

pytestmark = pytest.mark.sim

TESTS = Path(__file__).resolve().parent
PYTHON_DIR = TESTS.parent / "python"

#: A stand-in for the part of CuPy that cudacore.interop.cupy_allocator and the plugin use.
CUPY_STAND_IN = {
    "cupy/__init__.py": "from . import cuda\n",
    "cupy/cuda/__init__.py": textwrap.dedent(
        '''
        """The allocator API of CuPy, without a GPU: tests of cudacore.dask only."""
        from . import memory, runtime


        def stand_in_pool(size):
            return memory.MemoryPointer(memory.UnownedMemory(0, size, None, 0), 0)


        _current = stand_in_pool


        def get_allocator():
            return _current


        def set_allocator(allocator=None):
            global _current
            _current = stand_in_pool if allocator is None else allocator


        def alloc(size):
            return _current(size)


        def get_current_stream():
            return None
        '''
    ),
    "cupy/cuda/memory.py": textwrap.dedent(
        """
        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=None):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset
        """
    ),
    "cupy/cuda/runtime.py": "def getDevice():\n    return 0\n",
}


@pytest.fixture(scope="module")
def cupy_stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cupy_stand_in")
    for name, text in CUPY_STAND_IN.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# -- serializers, in this process ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["dask", "cuda"])
def test_buffer_round_trips_through_each_family(dev: cc.Device, family: str) -> None:
    data = bytes(i % 251 for i in range(100_003))
    buf = dev.allocate(len(data))
    buf.copy_from(data)
    header, frames = serialize(buf, serializers=(family,), on_error="raise")
    assert header["serializer"] == family and len(frames) == 1
    if family == "cuda":
        assert frames[0] is buf  # the device memory itself goes to the transport: no host copy
    else:
        assert isinstance(frames[0], memoryview) and bytes(frames[0]) == data
    got = deserialize(header, frames)
    try:
        assert type(got) is cc.Buffer and got is not buf and got.ptr != buf.ptr
        assert (got.size, got.device_id) == (buf.size, buf.device_id)
        out = bytearray(got.size)
        got.copy_to(out)
        assert out == data
    finally:
        got.close()
        buf.close()


def test_a_view_and_an_external_buffer_arrive_as_their_bytes(dev: cc.Device) -> None:
    buf = dev.allocate(64)
    buf.copy_from(bytes(range(64)))
    for sent, want in ((buf[8:24], bytes(range(8, 24))), (cc.asbuffer(buf), bytes(range(64)))):
        for family in ("dask", "cuda"):
            got = deserialize(*serialize(sent, serializers=(family,), on_error="raise"))
            out = bytearray(got.size)
            got.copy_to(out)
            assert type(got) is cc.Buffer and out == want, family
            got.close()
        sent.close()
    buf.close()


def test_dask_counts_a_buffer_as_its_bytes(dev: cc.Device) -> None:
    from dask.sizeof import sizeof

    buf = dev.allocate(12345)
    assert sizeof(buf) == sizeof(buf[100:200]) + 12245 == 12345
    buf.close()
    assert sizeof(buf) == 0


def test_a_closed_buffer_is_refused(dev: cc.Device) -> None:
    buf = dev.allocate(16)
    buf.close()
    for fn in (cdask.dask_serialize_buffer, cdask.cuda_serialize_buffer):
        with pytest.raises(cc.CUDAError, match="closed cudacore Buffer .* cannot be sent to another worker") as info:
            fn(buf)
        assert info.value.name == "CUDACORE_ERROR_CLOSED"
    # Through distributed's own entry point the refusal is the cause of its TypeError.
    with pytest.raises(TypeError, match="Could not serialize") as info2:
        serialize(buf, serializers=("dask",), on_error="raise")
    assert isinstance(info2.value.__cause__, cc.CUDAError)


def test_a_frame_of_the_wrong_size_is_refused(dev: cc.Device) -> None:
    buf = dev.allocate(32)
    header, _ = serialize(buf, serializers=("dask",), on_error="raise")
    before = dev.memory_stats()["in_use"]
    with pytest.raises(cc.InvalidValueError):
        deserialize(header, [memoryview(bytearray(31))])
    with pytest.raises(cc.InvalidValueError, match="one frame"):
        cdask.dask_deserialize_buffer({"size": 32, "device": 0}, [b"x" * 16, b"x" * 16])
    assert dev.memory_stats()["in_use"] == before  # the Buffer made for the arrival was freed
    buf.close()


def test_devices_and_the_plugin_in_one_process() -> None:
    """On two simulated devices: a Buffer keeps its device when no plugin serves the process; with the
    plugin it arrives on the plugin's device; the plugin refuses a device the process lacks, or a second
    device in one process; teardown undoes only the last worker's installation."""
    out = run_python(
        textwrap.dedent(
            """
            import json
            import cudacore as cc
            import cudacore.dask as cdask
            from distributed.protocol import deserialize, serialize

            class W:
                def __init__(self, id): self.id = id

            facts = {}
            buf = cc.Device(1).allocate(8)
            buf.copy_from(b"abcdefgh")
            for fam in ("dask", "cuda"):
                got = deserialize(*serialize(buf, serializers=(fam,), on_error="raise"))
                facts["no_plugin_" + fam] = got.device_id
            p0, p1 = cdask.CudacorePlugin(), cdask.CudacorePlugin()
            p0.setup(W("w0")); p1.setup(W("w1"))
            facts["libraries"] = p0.libraries
            for fam in ("dask", "cuda"):
                got = deserialize(*serialize(buf, serializers=(fam,), on_error="raise"))
                out = bytearray(8); got.copy_to(out)
                facts["plugin_" + fam] = [got.device_id, bytes(out).decode()]
            for bad in (cdask.CudacorePlugin(device=1), cdask.CudacorePlugin(device=7)):
                try:
                    bad.setup(W("w2"))
                    facts.setdefault("refused", []).append(None)
                except cc.CUDAError as e:
                    facts.setdefault("refused", []).append([type(e).__name__, str(e)])
            facts["hooks_while_installed"] = cdask._note_task_oom in cc._errors.HOOKS
            p0.teardown(W("w0")); p0.teardown(W("w0"))  # a second teardown does nothing
            facts["after_first_teardown"] = cdask._installed is not None
            p1.teardown(W("w1"))
            facts["after_last_teardown"] = cdask._installed is not None
            facts["libraries_after"] = p1.libraries
            facts["hooks_after"] = cdask._note_task_oom in cc._errors.HOOKS
            got = deserialize(*serialize(buf, serializers=("dask",), on_error="raise"))
            facts["uninstalled"] = got.device_id
            for bad in (-1, "0", True):
                try:
                    cdask.CudacorePlugin(device=bad)
                except TypeError:
                    facts.setdefault("type_errors", 0)
                    facts["type_errors"] += 1
            print(json.dumps(facts))
            """
        ),
        env={
            "CUDACORE_BACKEND": "sim",
            "CUDACORE_SIM_DEVICES": json.dumps([{"name": "a", "total_memory": 1 << 28}, {"name": "b", "total_memory": 1 << 28}]),
            "PYTHONPATH": str(PYTHON_DIR),
        },
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["no_plugin_dask"] == facts["no_plugin_cuda"] == 1
    assert facts["plugin_dask"] == facts["plugin_cuda"] == [0, "abcdefgh"]
    assert facts["libraries"]["cupy"] == "not installed"
    assert facts["libraries"]["rmm"] in ("not installed", "left as it is: cudacore does not provide an RMM memory resource yet")
    (kind1, msg1), (kind7, _) = facts["refused"]
    assert kind1 == "InvalidValueError" and "serves device 0" in msg1
    assert kind7 == "InvalidValueError"
    assert facts["hooks_while_installed"] and not facts["hooks_after"]
    assert facts["after_first_teardown"] and not facts["after_last_teardown"]
    assert facts["libraries_after"] == {}
    assert facts["uninstalled"] == 1
    assert facts["type_errors"] == 3


# -- the out-of-memory error itself ----------------------------------------------------------------------------


def test_out_of_memory_pickles_with_its_verdict(dev: cc.Device) -> None:
    with pytest.raises(cc.OutOfMemoryError) as info:
        dev.allocate(1 << 50)
    e = info.value
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cc.OutOfMemoryError and str(back) == str(e)
    assert (back.cause, back.requested, back.device, back.total, back.fields) == (e.cause, e.requested, e.device, e.total, e.fields)
    assert back.flight_record == e.flight_record and back.flight_record[-1]["kind"] == "oom"


# -- a LocalCluster ---------------------------------------------------------------------------------------------


def _workload(mode: str, stand_in: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(stand_in), str(PYTHON_DIR), str(TESTS)])
    if mode == "threads":  # the workers are this process's threads: it selects the simulator itself
        env["CUDACORE_BACKEND"] = "sim"
        env["CUDACORE_SIM_DEVICES"] = json.dumps([{"name": "sim-worker", "total_memory": 256 << 20}])
    r = subprocess.run(
        [sys.executable, str(TESTS / "dask_workload.py"), mode, str(stand_in)],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    return json.loads(r.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_local_cluster(mode: str, cupy_stand_in: Path) -> None:
    f = _workload(mode, cupy_stand_in)
    a, b = f["workers"]
    assert f["backends"] == ["sim"]

    # The plugin: refused typed for a device the workers lack, then installed on both workers.
    assert f["bad_device"] == "InvalidValueError"
    assert sorted(f["register"]) == [a, b] and all(v["status"] == "OK" for v in f["register"].values())
    for w in (a, b):
        assert f["libraries"][w]["cupy"] == "installed: CuPy allocates from cudacore on device 0"
        cupy = f["cupy"][w]
        assert "cupy_allocator" in cupy["allocator"] and cupy["owner"] == "Buffer"
        assert cupy["grew"] == 3 << 20 and cupy["after"] == 0  # CuPy's memory was cudacore's, and went back

    # Every chunk crossed to the other worker as a new Buffer of cudacore's and came back exact.
    assert f["equal"] and f["sum_equal"]
    for arrived in f["arrived"]:
        assert arrived["type"] == "Buffer" and arrived["is_buffer"] and arrived["device"] == 0
        assert arrived["size"] == 1024 * 8 and arrived["new_memory"]
        assert arrived["other_process"] == (mode == "processes")

    # memory_report names both workers, as text and as HTML.
    assert f["report_workers"] == [a, b]
    for text in (f["report_text"], f["report_html"]):
        assert a in text and b in text
    assert f["report_text"].count("device 0: sim-worker (sim)") == 2

    # The out of memory arrives typed with the worker's verdict; the worker let go of what the task held.
    oom = f["oom"]
    assert oom is not None and oom["type"] == "OutOfMemoryError", oom
    assert oom["cause"] == "exhausted" and oom["requested"] == 128 << 20 and oom["device"] == 0
    assert oom["in_use"] >= 192 << 20 and oom["total"] == 256 << 20 and oom["last_event"] == "oom"
    assert oom["message"].startswith("memory exhausted by this process")
    assert f["in_use_after_oom"] == f["in_use_before_oom"]
    assert "exhausted" in f["ooms_reported"][a]
    assert "out-of-memory verdicts" in f["report_after_text"] and "128.0 MiB requested: exhausted" in f["report_after_text"]
    assert f["after_oom_equal"]

    # Unregistered: CuPy has its own allocator back, and cudacore holds none of its memory.
    for w in (a, b):
        assert f["cupy_after_unregister"][w]["allocator"] == "stand_in_pool"
        assert f["cupy_after_unregister"][w]["grew"] == 0
        assert cdask.PLUGIN_NAME not in f["plugins_after_unregister"][w]

"""The C hot paths of Kernel.launch and Buffer.copy_from / copy_to agree with the general path they stand
in for: on what is host and what is device memory, on read-only destinations, arrays of Python objects,
bytes passed by value, CuPy's array class and interrupts raised while an argument is read. Found by an
adversarial review of those paths; each test fails while its bug is there."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import cudacore as cc
from cudacore._native import fast

from conftest import run_python

FILL_PTX = Path(__file__).parent / "kernels" / "fill.ptx"


def _read(buf: cc.Buffer) -> bytes:
    out = bytearray(buf.size)
    buf.copy_to(out)
    return bytes(out)


@pytest.fixture(scope="module")
def fill_kernel() -> Any:
    m = cc.Device(0).load_module(FILL_PTX)
    yield m.function("fill")
    m.unload()


def _c_launch(k: Any, args: tuple[Any, ...]) -> str:
    """What fast.launch did with args on the simulator: "C" packed and handed to the door (which refuses to
    run device code), "general" left to the general path."""
    try:
        r = fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, args, k._spec)
    except cc.NotSupportedError:
        return "C"
    assert r is NotImplemented
    return "general"


# -- copies ---------------------------------------------------------------------------------------------


@pytest.mark.sim
@pytest.mark.parametrize("kw", [{}, {"nbytes": 8}, {"nbytes": 8, "offset": 8, "src_offset": 4}], ids=repr)
def test_host_memory_with_a_cuda_array_interface_is_copied_as_the_general_path_copies_it(dev: cc.Device, kw: dict) -> None:
    # The general path (_classify) takes an object with __cuda_array_interface__ as device memory even when
    # it also has the buffer protocol (a numba mapped array): the C hot path must leave it to it, whole copy
    # or part.
    dev_src = dev.allocate(64)
    dev_src.copy_from(bytes([0xDD]) * 64)

    class Both(np.ndarray):
        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return {"shape": (64,), "typestr": "|u1", "data": (dev_src.ptr, False), "version": 3}

    h = np.full(64, 0x11, np.uint8).view(Both)
    got = []
    for call in (lambda b: b.copy_from(h, **kw), lambda b: type(b)._copy_from(b, h, **kw)):
        with dev.allocate(64) as b:
            b.fill(0)
            call(b)
            got.append(_read(b))
    dev_src.close()
    assert got[0] == got[1], "C copied the host bytes, the general path the device array's"


@pytest.mark.sim
@pytest.mark.parametrize("host_kind", ["pinned", "numpy"])
@pytest.mark.parametrize("kw", [{}, {"nbytes": 8, "offset": 8}], ids=repr)
def test_a_copy_given_no_stream_under_with_s_runs_on_s_and_waits_as_the_general_path(
    dev: cc.Device, host_kind: str, kw: dict
) -> None:
    # Inside `with s:` a copy given no stream is ordered on s and returns once the data has arrived, in C
    # as in the general path: the same bytes both ways. (The simulator runs work at once, so the wait is
    # observable on the GPU only: test_gpu_a_copy_given_no_stream_under_with_s_waits_for_s.)
    s = dev.create_stream()
    pinned = dev.allocate_pinned(64)
    host: Any = None
    src: Any = None
    try:
        for call in ("C", "general"):
            host = pinned.numpy() if host_kind == "pinned" else np.zeros(64, np.uint8)
            src = pinned if host_kind == "pinned" else host
            with dev.allocate(64) as b:
                b.fill(0)
                with s:
                    b.fill(0x5A, stream=s)  # queued on s: the copy below must come after it
                    host[:] = 0
                    (b.copy_to if call == "C" else lambda h, **k: type(b)._copy_to(b, h, **k))(src, **kw)
                    n = kw.get("nbytes", 64)
                    assert bytes(host[:n]) == b"\x5a" * n, call
                    host[:] = 0x21
                    (b.copy_from if call == "C" else lambda h, **k: type(b)._copy_from(b, h, **k))(src, **kw)
                    back = np.zeros(64, np.uint8)
                    b.copy_to(back, stream=s)
                    s.synchronize()
                off = kw.get("offset", 0)
                assert bytes(back[off : off + n]) == b"\x21" * n, call
    finally:
        host = src = None  # the views of the pinned memory go before it does
        pinned.close()
        s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["C", "general"])
def test_gpu_a_copy_given_no_stream_under_with_s_waits_for_s(dev: cc.Device, call: str) -> None:
    # A fill of 1 GiB queued on s takes a fraction of a millisecond; a pinned copy_to with no stream inside
    # `with s:` is queued after it on s and must not return before it has landed.
    s = dev.create_stream()
    big = dev.allocate(1 << 30, stream=s)
    pinned = dev.allocate_pinned(4096)
    view = pinned.numpy()
    try:
        for value in (0x11, 0x22, 0x33):
            view[:] = 0
            with s:
                big.fill(value, stream=s)
                part = big[(1 << 30) - 4096 :]
                if call == "C":
                    part.copy_to(pinned)
                else:
                    type(part)._copy_to(part, pinned)
                assert bytes(view) == bytes([value]) * 4096, "the copy returned before the fill queued on s landed"
                del part  # a view keeps big open
    finally:
        del view
        pinned.close()
        big.close()
        s.close()


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["C", "general"])
def test_gpu_a_small_copy_into_pageable_memory_lets_other_threads_run_while_it_waits(dev: cc.Device, call: str) -> None:
    # A copy to the host waits for the work queued on its stream before it lands in pageable memory: it
    # must not hold the GIL meanwhile. With a long switch interval a thread that wants the GIL runs only if
    # the copy releases it.
    import sys
    import threading

    s = dev.create_stream()
    big = dev.allocate(1 << 30, stream=s)
    out = np.zeros(8, np.uint8)
    ticks = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    interval = sys.getswitchinterval()
    t = threading.Thread(target=count)
    try:
        for _ in range(20):
            big.fill(1, stream=s)  # milliseconds of work queued on s
        sys.setswitchinterval(0.5)
        t.start()
        before = ticks[0]
        part = big[:8]
        if call == "C":
            part.copy_to(out, stream=s)
        else:
            type(part)._copy_to(part, out, stream=s)
        during = ticks[0] - before
        del part  # a view keeps big open
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        if t.is_alive():
            t.join()
        big.close()
        s.close()
    assert bytes(out) == b"\x01" * 8
    assert during > 0, "no other thread ran while the copy waited for its stream: it held the GIL"


@pytest.mark.sim
@pytest.mark.parametrize("host_kind", ["bytes", "pinned", "staged"])
@pytest.mark.parametrize("into", [True, False], ids=["copy_from", "copy_to"])
def test_a_copy_given_no_stream_under_a_closed_current_stream_is_refused_as_the_general_path_refuses(
    dev: cc.Device, host_kind: str, into: bool
) -> None:
    # The same error, message included (it says the current stream was closed inside its block, and what
    # to do), for host memory of every hot case: pageable, pinned, pageable large enough to be staged. The C
    # path must not hand the closed Stream's handle to Go, where a stream created since may have it.
    n = 64 if host_kind != "staged" else 3 << 20
    s = dev.create_stream()
    pinned = dev.allocate_pinned(n) if host_kind == "pinned" else None
    host: Any = pinned if pinned is not None else bytearray(n)
    errors = []
    try:
        with dev.allocate(n) as b:
            general = (lambda h: type(b)._copy_from(b, h)) if into else (lambda h: type(b)._copy_to(b, h))
            with s:
                s.close()
                for call in (b.copy_from if into else b.copy_to, general):
                    with pytest.raises(cc.CUDAError) as e:
                        call(host)
                    errors.append((type(e.value), str(e.value)))
    finally:
        host = None
        if pinned is not None:
            pinned.close()
    assert errors[0] == errors[1]


@pytest.mark.sim
@pytest.mark.parametrize("kw", [{"nbytes": 8}, {"nbytes": 8, "offset": 8}], ids=repr)
def test_the_c_copy_from_refuses_a_read_only_external_buffer_as_the_general_path_does(dev: cc.Device, kw: dict) -> None:
    # Memory its owner declared read-only is refused by the Python overrides (ExternalBuffer.copy_from,
    # BufferView.copy_from) and by the general path (_check_writable); the C method Buffer.copy_from,
    # reached through the base class, must refuse it too.
    backing = dev.allocate(64)
    backing.fill(0)

    class RO:
        def __init__(self, ptr: int) -> None:
            self.__cuda_array_interface__ = {"shape": (64,), "typestr": "|u1", "data": (ptr, True), "version": 3}

    ro = cc.asbuffer(RO(backing.ptr))
    assert ro.readonly
    with pytest.raises(cc.InvalidValueError, match="read-only"):
        cc.Buffer._copy_from(ro, bytes([3]) * 64, **kw)  # the general path
    try:
        with pytest.raises(cc.InvalidValueError, match="read-only"):
            cc.Buffer.copy_from(ro, bytes([3]) * 64, **kw)  # the C path: accepted, and written
    finally:
        written = _read(backing) != bytes(64)
        ro.close()
        backing.close()
    assert not written


@pytest.mark.sim
@pytest.mark.parametrize("kw", [{"nbytes": 8}, {"nbytes": 8, "src_offset": 8}], ids=repr)
def test_a_partial_copy_from_an_object_array_is_refused_as_the_whole_copy_is(dev: cc.Device, kw: dict) -> None:
    # The whole copy is refused ("holds Python objects"); a part must be too: a cast of the memory to bytes
    # would hide the 'O' format and upload PyObject* addresses.
    objs = np.array([object() for _ in range(8)], dtype=object)
    with dev.allocate(64) as buf:
        with pytest.raises((TypeError, cc.InvalidValueError)):
            buf.copy_from(objs)
        with pytest.raises((TypeError, cc.InvalidValueError)):
            buf.copy_from(objs, **kw)


@pytest.mark.sim
def test_a_partial_copy_to_an_object_array_is_refused_and_does_not_crash() -> None:
    # Accepted, the device bytes would overwrite the array's PyObject* slots and the process would crash when
    # the array is used or freed. Run apart, as it would kill the process.
    code = textwrap.dedent(
        """
        import numpy as np, cudacore as cc
        buf = cc.Device(0).allocate(64)
        buf.fill(0x41)
        objs = np.array([object() for _ in range(8)], dtype=object)
        try:
            buf.copy_to(objs, nbytes=16, offset=8, dst_offset=16)
            print("ACCEPTED", flush=True)
        except (TypeError, cc.InvalidValueError) as e:
            print("refused")
        del objs
        print("survived")
        """
    )
    r = run_python(code, env={"CUDACORE_BACKEND": "sim"}, timeout=120)
    assert r.returncode == 0, f"rc {r.returncode}: {r.stdout} {r.stderr[-500:]}"
    assert r.stdout.split() == ["refused", "survived"]


# -- launches -------------------------------------------------------------------------------------------


class _CAIBytes(bytes):
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (8,), "typestr": "|u1", "data": (0x2000, False), "version": 3}


class _CAIByteArray(bytearray):
    __cuda_array_interface__ = _CAIBytes.__cuda_array_interface__


@pytest.mark.sim
@pytest.mark.parametrize("cls", [_CAIBytes, _CAIByteArray], ids=lambda c: c.__name__)
def test_a_bytes_subclass_is_a_struct_by_value_in_c_as_in_the_general_path(fill_kernel: Any, cls: type) -> None:
    # A bytes or bytearray subclass carrying __cuda_array_interface__ is a struct by value to the general
    # path (_convert: isinstance bytes first): its 8 bytes (0x0101010101010101), not the interface's
    # pointer (0x2000). C must not pack the pointer.
    arg = cls(b"\x01" * 8)
    general = fill_kernel.encode_args((arg, 7, 16))
    assert general[3:11] == b"\x01" * 8  # the general path: the bytes themselves
    assert _c_launch(fill_kernel, (arg, 7, 16)) == "general", "C packed the interface's pointer instead of the bytes"


@pytest.mark.sim
def test_the_cupy_class_decision_follows_a_change_of_module(fill_kernel: Any) -> None:
    # is_cupy_ndarray keeps its answer for the last type only while the type is unchanged: a class that stops
    # being "cupy" goes by its interface from then on.
    class _Mem:
        ptr = 0x2000

    class ndarray:  # CuPy's class name
        size = 4
        data = _Mem()
        # not packable in C: the general path must be reached when the interface is what counts
        __cuda_array_interface__: ClassVar[dict[str, Any]] = {"shape": (4,), "typestr": "<u4", "data": (2**70, False), "version": 3}

    ndarray.__module__ = "cupy"
    assert _c_launch(fill_kernel, (ndarray(), 7, 16)) == "C"
    ndarray.__module__ = "notcupy"
    assert _c_launch(fill_kernel, (ndarray(), 7, 16)) == "general"


@pytest.mark.sim
def test_a_keyboard_interrupt_in_a_cupy_array_property_is_not_swallowed(fill_kernel: Any) -> None:
    # An ordinary error from size / data / data.ptr sends the argument to its interface; one that must not be
    # lost (a KeyboardInterrupt, a MemoryError) reaches the caller, and nothing is launched.
    def interrupted(self: Any) -> int:
        raise KeyboardInterrupt

    cls = type(
        "ndarray",
        (),
        {
            "__module__": "cupy",
            "size": property(interrupted),
            "__cuda_array_interface__": {"shape": (4,), "typestr": "<u4", "data": (0x2000, False), "version": 3},
        },
    )
    with pytest.raises(KeyboardInterrupt):
        _c_launch(fill_kernel, (cls(), 7, 16))

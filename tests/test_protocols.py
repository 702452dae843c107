"""Buffer.copy_from / copy_to with any memory, views by slicing, fill, Device.to_device and from_array
(issue 31, item 2: the protocols). On the simulator: copies and memsets move real bytes."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import cudacore as cc


class HostDLPack:
    """Host memory offered only through DLPack (as a CPU torch tensor is): no buffer protocol."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kw: Any) -> Any:
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.a.__dlpack_device__()


class CAIArray:
    """Device memory offered only through the CUDA Array Interface (as a Numba device array is)."""

    def __init__(self, buf: cc.Buffer) -> None:
        self.buf = buf
        self.__cuda_array_interface__ = {"shape": (buf.size,), "typestr": "|u1", "data": (buf.ptr, False), "version": 3}


def _read(buf: cc.Buffer) -> bytes:
    out = bytearray(buf.size)
    buf.copy_to(out)
    return bytes(out)


def test_a_size_mismatch_is_refused_and_nbytes_copies_part(dev: cc.Device) -> None:
    with dev.allocate(1 << 20) as buf:
        with pytest.raises(cc.InvalidValueError, match=r"the source holds 10 bytes and the buffer 1048576.*pass nbytes=10"):
            buf.copy_from(bytes(10))  # used to copy 10 bytes in silence
        with pytest.raises(cc.InvalidValueError, match="the destination holds 10 bytes"):
            buf.copy_to(bytearray(10))
        buf.copy_from(bytes(range(10)), nbytes=10)
        head = bytearray(10)
        buf.copy_to(head, nbytes=10)  # was refused
        assert bytes(head) == bytes(range(10))
        # offsets on both sides, and one value read back without copying the whole buffer
        buf.copy_from(bytes(range(100)), offset=1000, src_offset=40, nbytes=8)
        one = np.zeros(1, np.uint64)
        buf[1000:1008].copy_to(one)  # through a view
        assert one.tobytes() == bytes(range(40, 48))
        buf.copy_to(one, offset=1000, nbytes=8)  # or offset= and nbytes= (the rest of buf is not one's size)
        assert one.tobytes() == bytes(range(40, 48))
        host = bytearray(16)
        buf.copy_to(host, offset=1000, dst_offset=4, nbytes=8)
        assert bytes(host) == bytes(4) + bytes(range(40, 48)) + bytes(4)
        with pytest.raises(cc.InvalidValueError, match="nbytes=20 but the source holds 10"):
            buf.copy_from(bytes(10), nbytes=20)
        with pytest.raises(cc.InvalidValueError, match="offset 2000000 is past the end"):
            buf.copy_from(bytes(1), offset=2_000_000)


def test_device_buffers_cai_and_dlpack_objects_are_device_copies(dev: cc.Device) -> None:
    a, b = dev.allocate(64), dev.allocate(64)
    a.copy_from(bytes(range(64)))
    b.copy_from(a)  # a device Buffer: device to device (was a TypeError)
    assert _read(b) == bytes(range(64))
    s = dev.create_stream()
    b.fill(0)
    a.copy_to(b, s)
    s.synchronize()
    assert _read(b) == bytes(range(64))
    c = dev.allocate(64)
    c.copy_from(CAIArray(a))  # the CUDA Array Interface
    assert _read(c) == bytes(range(64))
    c.fill(1)
    c.copy_to(CAIArray(b), nbytes=8, dst_offset=8)
    assert _read(b)[:16] == bytes(range(8)) + bytes([1]) * 8
    c.copy_from(HostDLPack(np.arange(64, dtype=np.uint8)[::-1].copy()))  # a host DLPack tensor: host copy
    assert _read(c) == bytes(range(63, -1, -1))
    out = np.zeros(64, np.uint8)
    c.copy_to(HostDLPack(out))
    assert out.tobytes() == bytes(range(63, -1, -1))
    with pytest.raises(TypeError, match="neither host memory .* nor device memory"):
        c.copy_from(object())
    for x in (a, b, c):
        x.close()
    s.close()


def test_views_share_memory_and_hold_the_parent(dev: cc.Device) -> None:
    buf = dev.allocate(256)
    buf.copy_from(bytes(range(256)))
    v = buf[16:32]
    assert isinstance(v, cc.Buffer) and v.size == 16 and v.ptr == buf.ptr + 16 and v.offset == 16
    assert _read(v) == bytes(range(16, 32))
    v.fill(0xAA)  # writes through to the parent
    assert _read(buf)[16:32] == b"\xaa" * 16
    assert buf[-16:].ptr == buf.ptr + 240 and buf[:].size == 256
    w = v[4:8]  # a view of a view
    assert w.ptr == buf.ptr + 20
    cai = v.__cuda_array_interface__
    assert cai["shape"] == (16,) and cai["data"] == (buf.ptr + 16, False)
    with pytest.raises(BufferError, match=r"while 1 view of it \(buf\[start:stop\]\) is open"):
        buf.close()  # the view shares its memory
    assert not buf.closed
    with pytest.raises(BufferError, match="view"):
        v.close()  # w views v
    w.close()
    v.close()
    buf.close()
    assert buf.closed
    # the view keeps the parent object alive; collecting the view lets the parent go
    parent = dev.allocate(64)
    view = parent[8:16]
    del parent
    gc.collect()
    assert view.parent is not None and not view.parent.closed
    view.parent.copy_from(bytes(64))
    p = view.parent
    del view
    p.close()


def test_views_refuse_steps_and_bounds_outside(dev: cc.Device) -> None:
    with dev.allocate(64) as buf:
        with pytest.raises(ValueError, match="no step"):
            buf[::2]
        with pytest.raises(ValueError, match="outside the buffer"):
            buf[0:100]
        with pytest.raises(TypeError, match=r"sliced by bytes"):
            buf[3]  # type: ignore[index]


def test_views_export_dlpack_and_copy(dev: cc.Device) -> None:
    with dev.allocate(64) as buf:
        buf.copy_from(bytes(range(64)))
        v = buf[32:48]
        ext = cc.asbuffer(_DLPackOnly(v))  # a DLPack export of the view: its address and size
        assert ext.ptr == buf.ptr + 32 and ext.size == 16
        with pytest.raises(BufferError):
            v.close()  # the export is alive
        ext.close()
        del ext
        gc.collect()
        other = dev.allocate(16)
        other.copy_from(v)
        assert _read(other) == bytes(range(32, 48))
        other.close()
        v.close()


class _DLPackOnly:
    def __init__(self, b: cc.Buffer) -> None:
        self.b = b

    def __dlpack__(self, **kw: Any) -> Any:
        return self.b.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.b.__dlpack_device__()


def test_fill(dev: cc.Device) -> None:
    s = dev.create_stream()
    with dev.allocate(100, stream=s) as buf:
        buf.fill(7)
        assert _read(buf) == b"\x07" * 100
        buf.fill(255, stream=s)
        s.synchronize()
        assert _read(buf) == b"\xff" * 100
        for bad in (256, -1):
            with pytest.raises(cc.InvalidValueError, match="0..255"):
                buf.fill(bad)
        with pytest.raises(TypeError, match="must be an int"):
            buf.fill(1.5)  # type: ignore[arg-type]
        with s.capture() as g:
            buf.fill(3, stream=s)  # a memset node
        assert _read(buf) == b"\xff" * 100
        g.launch(s)
        s.synchronize()
        assert _read(buf) == b"\x03" * 100
        g.destroy()
    s.close()


def test_to_device_uploads_and_from_array_refuses_host(dev: cc.Device) -> None:
    host = np.arange(32, dtype=np.float32)
    buf = dev.to_device(host)
    assert type(buf) is cc.Buffer and buf.size == host.nbytes
    back = np.empty_like(host)
    buf.copy_to(back)
    assert (back == host).all()
    b2 = dev.to_device(HostDLPack(host))
    assert _read(b2) == host.tobytes()
    with pytest.raises(TypeError, match=r"host memory: upload it with Device.to_device\(array\)"):
        dev.from_array(host)
    with pytest.raises(TypeError, match=r"device memory already: view it without a copy with Device.from_array"):
        dev.to_device(buf)
    for x in (buf, b2):
        x.close()


def test_a_view_of_voided_graph_memory_is_gone_with_it(dev: cc.Device) -> None:
    # A Buffer allocated in a capture that ends without a graph is void (closed for its owner): a view of it
    # must not reach its address either. The C hot cases (a pinned copy on a Stream, a DLPack export, a
    # kernel argument) read the view's own pointer, so they check its parent too.
    s = dev.create_stream()
    pinned = dev.allocate_pinned(256)
    try:
        s.begin_capture("relaxed")
        parent = dev.allocate(1024, stream=s)
        view = parent[256:512]
        grandchild = parent[0:768][128:640]
        s.abort_capture()
        assert parent.closed, "void: closed for its owner"
        assert view.closed and grandchild.closed, "a view, at any depth, is gone with the memory it views"
        for gone in (view, grandchild):
            with pytest.raises(cc.CUDAError, match="closed"):
                gone.fill(7)
            with pytest.raises(cc.CUDAError, match="closed"):
                _ = gone.__cuda_array_interface__
        grandchild.close()
        with pytest.raises(cc.CUDAError, match="closed"):
            view.copy_from(pinned, stream=s)
        with pytest.raises(cc.CUDAError, match="closed"):
            view.copy_to(pinned, stream=s)
        with pytest.raises(cc.CUDAError, match="closed"):
            view.__dlpack__()
        with pytest.raises(cc.CUDAError, match="closed"):
            _ = view.ptr
        view.close()
    finally:
        pinned.close()
        s.close()


# The common forms of a partial host copy (nbytes=, offset=, src_offset= / dst_offset=, on a stream or not,
# from pageable or pinned memory) are made in C, as the whole-buffer copy is; the general path, which
# checks and explains, sees only what C leaves it. Both must move the same bytes.
_PARTS = [
    {"nbytes": 8},
    {"nbytes": 8, "offset": 1000},
    {"nbytes": 8, "offset": 1000, "other_offset": 40},
    {"offset": 4096 - 100, "other_offset": 0},  # without nbytes: both sides hold 100 bytes from their offsets
]


@pytest.mark.parametrize("part", _PARTS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("on_stream", [False, True], ids=["sync", "stream"])
@pytest.mark.parametrize("kind", ["bytearray", "numpy", "pinned"])
def test_partial_host_copies_are_made_in_c(dev: cc.Device, monkeypatch: pytest.MonkeyPatch, part: dict[str, int],
                                           on_stream: bool, kind: str) -> None:
    general: list[str] = []
    for name in ("_copy_from", "_copy_to"):
        orig = getattr(cc.Buffer, name)

        def spy(self: cc.Buffer, *a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> None:
            general.append(_name)
            _orig(self, *a, **kw)

        monkeypatch.setattr(cc.Buffer, name, spy)
    s = dev.create_stream() if on_stream else None
    src_len = 100 if "nbytes" not in part else 128
    pinned = [dev.allocate_pinned(src_len), dev.allocate_pinned(src_len)] if kind == "pinned" else []

    def host(fill: bytes) -> Any:
        if kind == "pinned":
            p = pinned.pop()
            memoryview(p)[:] = fill
            return p
        return bytearray(fill) if kind == "bytearray" else np.frombuffer(fill, np.uint8).copy()

    src = host(bytes((i * 7 + 3) % 256 for i in range(src_len)))
    dst = host(bytes(src_len))
    kw = {k: v for k, v in part.items() if k != "other_offset"}
    with dev.allocate(4096) as buf:
        buf.fill(0)
        buf.copy_from(src, s, src_offset=part.get("other_offset", 0), **kw)
        buf.copy_to(dst, s, dst_offset=part.get("other_offset", 0), **kw)
        if s is not None:
            s.synchronize()
        n = part.get("nbytes", 100)
        lo, o = part.get("offset", 0), part.get("other_offset", 0)
        whole = _read(buf)
        assert whole[lo : lo + n] == bytes(memoryview(src))[o : o + n]
        assert whole[:lo] == bytes(lo) and whole[lo + n :] == bytes(4096 - lo - n)
        assert bytes(memoryview(dst))[o : o + n] == bytes(memoryview(src))[o : o + n]
        assert general == []  # all of it in C
        # What C does not take reaches the general path, which refuses as before.
        with pytest.raises(cc.InvalidValueError, match=r"nbytes=\d+ but the source holds"):
            buf.copy_from(src, s, nbytes=src_len + 1)
        with pytest.raises(TypeError, match="nbytes must be an int"):
            buf.copy_from(src, s, nbytes=1.5)
        with pytest.raises(cc.InvalidValueError, match="must be >= 0"):
            buf.copy_to(dst, s, offset=-1, nbytes=1)
        assert general == ["_copy_from", "_copy_from", "_copy_to"]
    for h in (src, dst):
        if isinstance(h, cc.PinnedBuffer):
            h.close()
    if s is not None:
        s.close()

"""Interop on the simulator: DLPack capsules (parsed with ctypes), borrowed buffers, the C allocator entry
points PyTorch loads (called through ctypes), fault injection. The frameworks themselves run in
test_interop_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

import cudacore as cc
from cudacore import interop, testing
from cudacore.interop import _DLManagedTensor, _DLManagedTensorVersioned

pytestmark = pytest.mark.sim

_api = ctypes.pythonapi


def _capsule_struct(capsule: object, name: bytes, kind: type) -> ctypes.Structure:
    assert _api.PyCapsule_IsValid(capsule, name) == 1
    return kind.from_address(_api.PyCapsule_GetPointer(capsule, name))


def test_dlpack_device(dev: cc.Device) -> None:
    with dev.allocate(64) as buf:
        assert buf.__dlpack_device__() == (2, 0)


def test_dlpack_structs_have_dlpacks_layout() -> None:
    # dlpack.h's layout on a 64-bit platform; the C producer's structs come from the same description
    # (cudacore/internal/tablegen), and the capsule tests below read its output through these.
    from cudacore._tables import DLTensor

    assert ctypes.sizeof(DLTensor) == 48 and DLTensor.byte_offset.offset == 40
    assert ctypes.sizeof(_DLManagedTensor) == 64
    assert ctypes.sizeof(_DLManagedTensorVersioned) == 80 and _DLManagedTensorVersioned.dl_tensor.offset == 32


def test_legacy_capsule_describes_the_buffer(dev: cc.Device) -> None:
    buf = dev.allocate(4096)
    refs = sys.getrefcount(buf)
    cap = buf.__dlpack__()
    assert sys.getrefcount(buf) == refs + 1  # the capsule keeps the buffer alive
    m = _capsule_struct(cap, b"dltensor", _DLManagedTensor)
    t = m.dl_tensor
    assert t.data == buf.ptr
    assert (t.device.device_type, t.device.device_id) == (2, 0)
    assert t.ndim == 1 and t.shape[0] == 4096 and t.strides[0] == 1 and t.byte_offset == 0
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)
    with pytest.raises(BufferError, match="DLPack export"):
        buf.close()
    del cap, m, t  # an unconsumed capsule calls the deleter itself
    gc.collect()
    assert sys.getrefcount(buf) == refs
    buf.close()


def test_versioned_capsule(dev: cc.Device) -> None:
    with dev.allocate(100) as buf:
        cap = buf.__dlpack__(max_version=(1, 2), stream=-1)
        m = _capsule_struct(cap, b"dltensor_versioned", _DLManagedTensorVersioned)
        assert (m.version.major, m.version.minor) == (1, 0)
        assert m.flags == 0
        assert m.dl_tensor.shape[0] == 100 and m.dl_tensor.data == buf.ptr
        # An older max_version gets the unversioned capsule.
        assert _api.PyCapsule_IsValid(buf.__dlpack__(max_version=(0, 8)), b"dltensor") == 1
        del cap, m
        gc.collect()


def test_dlpack_refusals(dev: cc.Device) -> None:
    buf = dev.allocate(16)
    with pytest.raises(BufferError, match="copy=True"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cannot export"):
        buf.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="cannot export"):
        buf.__dlpack__(dl_device=(2, 3))
    with pytest.raises(TypeError):
        buf.__dlpack__(1)  # keyword-only
    with pytest.raises(ValueError, match="stream"):
        buf.__dlpack__(stream=-5)
    buf.__dlpack__(dl_device=(2, 0), copy=False)
    gc.collect()
    buf.close()
    with pytest.raises(cc.InvalidHandleError):
        buf.__dlpack__()


def test_dlpack_on_another_stream_synchronizes(dev: cc.Device) -> None:
    s = dev.create_stream()
    with dev.allocate(256, stream=s) as buf:
        for consumer in (None, 1, 2, -1, s.handle):
            cap = buf.__dlpack__(stream=consumer)
            del cap
        gc.collect()
    s.close()


def test_from_dlpack_round_trip(dev: cc.Device) -> None:
    buf = dev.allocate(1024)
    buf.copy_from(np.arange(256, dtype=np.float32))
    view = interop.from_dlpack(buf)
    assert isinstance(view, cc.ExternalBuffer) and isinstance(view, cc.Buffer)
    assert (view.ptr, view.size, view.device_id, view.borrowed) == (buf.ptr, 1024, 0, True)
    out = np.zeros(256, dtype=np.float32)
    view.copy_to(out)  # usable wherever cudacore takes a Buffer
    assert out[5] == 5.0
    view.copy_from(np.full(256, 7, dtype=np.float32))
    buf.copy_to(out)
    assert out[0] == 7.0
    with pytest.raises(BufferError):
        buf.close()
    before = dev.memory_stats()["in_use"]
    view.close()  # frees nothing, drops the capsule's tensor
    assert dev.memory_stats()["in_use"] == before
    gc.collect()
    buf.close()
    assert dev.memory_stats()["in_use"] == before - 1024


def test_from_dlpack_capsule_and_consumed(dev: cc.Device) -> None:
    with dev.allocate(64) as buf:
        cap = buf.__dlpack__()
        view = interop.from_dlpack(cap)
        assert view.ptr == buf.ptr
        with pytest.raises(ValueError, match="already consumed"):
            interop.from_dlpack(cap)
        del view, cap
        gc.collect()


class _CAI:
    """A stand-in for a CuPy/torch array: __cuda_array_interface__ over a cudacore buffer."""

    def __init__(self, buf: cc.Buffer, shape: tuple[int, ...], typestr: str = "<f4", strides: tuple[int, ...] | None = None) -> None:
        self.buf = buf
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (buf.ptr, False), "strides": strides, "version": 3, "stream": 1,
        }


def test_asbuffer_from_cuda_array_interface(dev: cc.Device) -> None:
    with dev.allocate(4096) as buf:
        arr = _CAI(buf, (32, 32))
        view = cc.asbuffer(arr)
        assert view.size == 4096 and view.ptr == buf.ptr and view.owner is arr and view.stream_handle == 0
        assert dev.from_array(arr).size == 4096
        assert cc.asbuffer(_CAI(buf, (32, 32), strides=(128, 4))).size == 4096  # explicit C strides
        with pytest.raises(ValueError, match="C-contiguous"):
            cc.asbuffer(_CAI(buf, (32, 16), strides=(256, 4)))
        assert cc.asbuffer(buf) is buf
        with pytest.raises(TypeError, match="neither"):
            cc.asbuffer(object())
        view.close()
        assert view.owner is None and view.closed


def test_external_buffer_keeps_its_owner(dev: cc.Device) -> None:
    buf = dev.allocate(64)
    arr = _CAI(buf, (16,))
    view = cc.asbuffer(arr)
    del arr
    gc.collect()
    assert isinstance(view.owner, _CAI)
    del view
    buf.close()


# -- the C entry points PyTorch's CUDAPluggableAllocator loads, called here through ctypes -----------------


def _torch_lib() -> ctypes.CDLL:
    """The extension as PyTorch loads it: its allocator entry points, and the generated native doors of
    the facade that they call (cudacore_door_TorchMalloc returns the wire-format error text)."""
    lib = ctypes.CDLL(interop.extension_path())
    lib.cudacore_torch_alloc.restype = ctypes.c_void_p
    lib.cudacore_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_torch_free.restype = None
    lib.cudacore_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_door_TorchMalloc.restype = ctypes.c_void_p  # char *: the error text, NULL on success
    lib.cudacore_door_TorchMalloc.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                              ctypes.POINTER(ctypes.c_int64)]  # fmt: skip
    return lib


def _door_malloc(lib: ctypes.CDLL, size: int) -> tuple[int, str | None]:
    out = ctypes.c_int64(0)
    err = lib.cudacore_door_TorchMalloc(size, 0, 0, ctypes.byref(out))
    if not err:
        return out.value, None
    text = ctypes.string_at(err).decode()
    ctypes.CDLL(None).free(ctypes.c_void_p(err))
    return 0, text


def test_torch_entry_points_use_cudacore_allocator(dev: cc.Device) -> None:
    lib = _torch_lib()
    before = dev.memory_stats()
    p = lib.cudacore_torch_alloc(1 << 20, 0, None)
    assert p
    mid = dev.memory_stats()
    assert mid["in_use"] == before["in_use"] + (1 << 20)
    assert mid["allocations"] == before["allocations"] + 1
    assert interop.torch_live_allocations() == 1
    lib.cudacore_torch_free(p, 1 << 20, 0, None)
    assert dev.memory_stats()["in_use"] == before["in_use"]
    assert interop.torch_live_allocations() == 0
    assert interop.last_error() is None
    assert lib.cudacore_torch_alloc(0, 0, None) is None  # size 0: NULL, no error
    assert interop.last_error() is None


def test_torch_malloc_oom_is_an_error_and_recorded(dev: cc.Device) -> None:
    lib = _torch_lib()
    p, text = _door_malloc(lib, 1 << 50)
    assert p == 0 and text is not None and text.startswith("cuda[2 CUDA_ERROR_OUT_OF_MEMORY")
    err = interop.last_error()
    assert isinstance(err, cc.OutOfMemoryError) and isinstance(err, MemoryError)
    assert interop.last_error() is None  # read once
    dev.memory_limit = dev.memory_stats()["in_use"] + (1 << 20)
    try:
        assert _door_malloc(lib, 2 << 20)[0] == 0
        assert "limit" in str(interop.last_error())
    finally:
        dev.memory_limit = None


def test_torch_free_of_a_foreign_pointer_is_refused(dev: cc.Device) -> None:
    lib = _torch_lib()
    lib.cudacore_torch_free(0x1234, 16, 0, None)
    assert isinstance(interop.last_error(), cc.InvalidValueError)
    lib.cudacore_torch_free(None, 0, 0, None)  # NULL: ignored
    assert interop.last_error() is None


def test_extension_path_is_the_loaded_library() -> None:
    path = interop.extension_path()
    lib = ctypes.CDLL(path)
    for name in ("cudacore_torch_alloc", "cudacore_torch_free", "PyInit__core", "PyInit__fast"):
        assert hasattr(lib, name)


def test_framework_allocators_need_their_framework() -> None:
    for name, fn in (("cupy", interop.cupy_allocator), ("torch", interop.torch_allocator)):
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except ImportError:
            with pytest.raises(ImportError):
                fn()


# -- fault injection at run time ------------------------------------------------------------------------


def test_fail_allocations(dev: cc.Device) -> None:
    dev.release_cached_memory()
    ooms = dev.memory_stats()["ooms"]
    testing.fail_allocations(nth=2)
    try:
        with dev.allocate(1 << 16):
            pass
        dev.release_cached_memory()
        with pytest.raises(cc.OutOfMemoryError):
            dev.allocate(1 << 16)
        with dev.allocate(1 << 16):  # the fault is spent
            pass
    finally:
        testing.clear_faults()
    assert dev.memory_stats()["ooms"] == ooms + 1


def test_inject_faults_rejects_bad_specs() -> None:
    with pytest.raises(cc.InvalidValueError, match="unknown entry point"):
        testing.inject_faults("cuNoSuchThing:1:2")
    with pytest.raises(cc.InvalidValueError):
        testing.inject_faults("cuMemAllocAsync:0:2")


def _refused_as_readonly(view: cc.Buffer, dev: cc.Device, src: cc.Buffer) -> None:
    """Every write cudacore makes into ``view`` is refused, nothing is written, and reads still work."""
    s = dev.create_stream()
    writes = [
        lambda: view.copy_from(bytes(view.size)),
        lambda: view.copy_from(bytes(view.size), stream=s),
        lambda: view.copy_from(dev.allocate_pinned(view.size), stream=s),  # the C method's hot case
        lambda: cc.device_to_device(view, src),
        lambda: cc.device_to_device(view, src, stream=s),
    ]
    for write in writes:
        with pytest.raises(cc.InvalidValueError, match="the destination is read-only"):
            write()
    out = bytearray(view.size)
    view.copy_to(out)  # reading is fine
    assert bytes(out) == bytes(range(view.size))
    cc.device_to_device(src, view)
    s.close()


def test_asbuffer_carries_the_read_only_flag_of_the_cuda_array_interface(dev: cc.Device) -> None:
    """Issue 30 item 19: data=(ptr, True) gives a read-only buffer that refuses writes, and says so when it
    hands the memory on; data=(ptr, False) stays writable."""
    backing, src = dev.allocate(64), dev.allocate(64)
    backing.copy_from(bytes(range(64)))
    arr = _CAI(backing, (64,), "|u1")
    arr.__cuda_array_interface__["data"] = (backing.ptr, True)
    view = cc.asbuffer(arr)
    assert isinstance(view, cc.ExternalBuffer) and view.readonly
    assert view.__cuda_array_interface__["data"] == (backing.ptr, True)
    assert "read-only" in repr(view)
    _refused_as_readonly(view, dev, src)
    writable = cc.asbuffer(_CAI(backing, (64,), "|u1"))
    assert not writable.readonly and writable.__cuda_array_interface__["data"] == (backing.ptr, False)
    writable.copy_from(bytes(64))
    for x in (view, writable, src):
        x.close()
    gc.collect()
    backing.close()


def test_from_dlpack_carries_the_read_only_flag(dev: cc.Device) -> None:
    """Issue 30 item 19: a DLPack 1.x tensor flagged read-only gives a read-only buffer."""
    backing, src = dev.allocate(64), dev.allocate(64)
    backing.copy_from(bytes(range(64)))
    cap = backing.__dlpack__(max_version=(1, 0))
    _capsule_struct(cap, b"dltensor_versioned", _DLManagedTensorVersioned).flags |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    view = interop.from_dlpack(cap)
    assert view.readonly
    _refused_as_readonly(view, dev, src)
    plain = interop.from_dlpack(backing.__dlpack__(max_version=(1, 0)))
    assert not plain.readonly
    for x in (view, plain, src):
        x.close()
    del cap
    gc.collect()
    backing.close()


@pytest.mark.parametrize("data", [(), (0,), [1, 2, 3], "0x10", ("0x10", False), None])
def test_asbuffer_refuses_a_malformed_data_entry(dev: cc.Device, data: object) -> None:
    """Issue 30 item 20: a malformed 'data' of the CUDA Array Interface is a ValueError naming it."""
    with dev.allocate(64) as backing:
        arr = _CAI(backing, (16,))
        arr.__cuda_array_interface__["data"] = data
        with pytest.raises(ValueError, match=r"__cuda_array_interface__\['data'\]"):
            cc.asbuffer(arr)


def test_read_only_memory_is_exported_read_only(dev: cc.Device) -> None:
    """Memory declared read-only, and views of it, leave through DLPack read-only (1.x carries the flag; a
    legacy export, which cannot, is refused): a consumer never gets a writable handle on it."""
    with dev.allocate(64) as backing:
        backing.copy_from(bytes(64))
        arr = _CAI(backing, (64,))
        arr.__cuda_array_interface__["data"] = (backing.ptr, True)
        ro = cc.asbuffer(arr)
        for src in (ro, ro[0:64], ro[0:64][0:32]):
            assert src.readonly
            cap = src.__dlpack__(max_version=(1, 0))
            assert _capsule_struct(cap, b"dltensor_versioned", _DLManagedTensorVersioned).flags & 1
            got = interop.from_dlpack(cap)
            assert got.readonly
            with pytest.raises(cc.InvalidValueError, match="read-only"):
                got.copy_from(b"\x07" * got.size)
            got.close()
            del cap
            with pytest.raises(BufferError, match="read-only"):
                src.__dlpack__()
        del src
        gc.collect()  # the views go, and with them their hold on ro
        out = bytearray(64)
        backing.copy_to(out)
        assert bytes(out) == bytes(64), "nothing wrote into the read-only memory"
        ro.close()


def test_the_cuda_array_interface_never_names_a_destroyed_stream(dev: cc.Device) -> None:
    """CAI v3's "stream" is the buffer's stream while its handle names it; after the stream was closed it is
    None (its work was waited for), never the dead handle a consumer would hand to the driver."""
    s = dev.create_stream()
    b, legacy = dev.allocate(64, stream=s), dev.allocate(64)
    v = b[0:8]
    assert b.__cuda_array_interface__["stream"] == s.handle
    assert v.__cuda_array_interface__["stream"] == s.handle
    assert legacy.__cuda_array_interface__["stream"] == 1
    s.close()
    assert b.__cuda_array_interface__["stream"] is None
    assert v.__cuda_array_interface__["stream"] is None
    v.close()
    b.close()
    legacy.close()

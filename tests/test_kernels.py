"""Modules and kernels (issue 5): loading, lookup, attributes, argument checks, launch validation, and the
device malloc heap proven on a real GPU.

Simulator tests check everything up to the driver's cuLaunchKernel, which the simulator refuses (it runs no
device code). GPU tests (marked ``gpu``) launch the kernels of tests/kernels; heap_malloc.ptx is compiled
there by scripts/gpu/build_ptx.sh.
"""

from __future__ import annotations

import array
import json
import textwrap
from typing import Any

import numpy as np
import pytest

import cudacore as cc

from conftest import ROOT, run_python

KERNELS = ROOT / "tests" / "kernels"
FILL_PTX = KERNELS / "fill.ptx"
HEAP_PTX = KERNELS / "heap_malloc.ptx"


class FakeBuffer:
    """A device buffer as the memory API gives one: only .ptr matters to a launch."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeArray:
    """Anything with __cuda_array_interface__ (CuPy, Numba, PyTorch)."""

    def __init__(self, ptr: int) -> None:
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<u4", "data": (ptr, False), "version": 3}


@pytest.fixture(scope="module")
def mod():
    m = cc.Device(0).load_module(FILL_PTX)
    yield m
    m.unload()


# -- loading and lookup (both backends) -----------------------------------------------------------


@pytest.mark.parametrize("form", ["path", "str path", "bytes", "text", "nul-terminated bytes"])
def test_load_forms(form):
    data = FILL_PTX.read_bytes()
    image = {
        "path": FILL_PTX,
        "str path": str(FILL_PTX),
        "bytes": data,
        "text": data.decode(),
        "nul-terminated bytes": data + b"\0",
    }[form]
    with cc.Device(0).load_module(image) as m:
        assert m.kind == "ptx"
        assert m.kernel_names == ("fill", "fill_f32")
        assert isinstance(m, cc.Module)
    assert m.closed


def test_function_and_attributes(mod):
    k = mod.function("fill")
    assert isinstance(k, cc.Kernel)
    assert mod.function("fill") is k
    a = k.attributes
    assert isinstance(a, cc.KernelAttributes)
    assert a.max_threads_per_block > 0 and a.registers == a.num_regs > 0
    assert set(a.as_dict()) >= {"num_regs", "shared_size_bytes", "max_threads_per_block", "local_size_bytes"}
    assert k.signature() == "fill(.u64 p, .u32 v, .u64 n)"
    assert [p.type for p in k.params] == ["u64", "u32", "u64"]


def test_unknown_function_is_not_found(mod):
    with pytest.raises(cc.NotFoundError) as ei:
        mod.function("fil")
    msg = str(ei.value)
    assert '"fil"' in msg and "fill, fill_f32" in msg
    assert isinstance(ei.value, LookupError)
    with pytest.raises(TypeError):
        mod.function(3)


@pytest.mark.parametrize(
    ("image", "kind", "match"),
    [
        (b"\xde\xad\xbe\xef garbage", "unknown", "de ad be ef"),
        (b"", "unknown", "empty"),
        (b"this is not a kernel", "unknown", "not PTX"),
        (b".version\n.entry k() { ret; }", "ptx", ".version"),
        (b".version 8.0\n.target sm_120\n.address_size 64\n.entry k() { ret; }", "ptx", "sm_120"),
    ],
)
def test_corrupt_image_is_invalid_image(image, kind, match):
    with pytest.raises(cc.InvalidImageError, match=match) as ei:
        cc.Device(0).load_module(image)
    assert ei.value.fields.get("kind") == kind


def test_corrupt_ptx_file(tmp_path):
    bad = tmp_path / "bad.ptx"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(cc.InvalidImageError):
        cc.Device(0).load_module(bad)
    with pytest.raises(FileNotFoundError):
        cc.Device(0).load_module(tmp_path / "missing.ptx")
    with pytest.raises(TypeError):
        cc.Device(0).load_module(12345)


def test_unloaded_module():
    m = cc.Device(0).load_module(FILL_PTX)
    k = m.function("fill")
    m.unload()
    m.unload()  # a second unload does nothing
    with pytest.raises(cc.InvalidHandleError):
        m.function("fill_f32")
    with pytest.raises(cc.InvalidHandleError):
        k.launch(grid=1, block=1, args=(FakeBuffer(0x1000), 1, 1))


# -- argument and configuration checks, before the driver -------------------------------------------


def test_wrong_argument_count(mod):
    k = mod.function("fill")
    with pytest.raises(
        cc.InvalidValueError,
        match=r"takes 3 arguments, got 2; its signature is fill\(.u64 p, .u32 v, .u64 n\)",
    ):
        k.launch(grid=1, block=32, args=(FakeBuffer(0x1000), 7))
    with pytest.raises(cc.InvalidValueError, match="got 4"):
        k.launch(grid=1, block=32, args=(FakeBuffer(0x1000), 7, 8, 9))


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((FakeBuffer(0x1000), 1.5, 8), TypeError, r"parameter .u32 v.*got float 1.5"),
        ((FakeBuffer(0x1000), "7", 8), TypeError, "cannot pass str"),
        ((FakeBuffer(0x1000), None, 8), TypeError, "None"),
        ((FakeBuffer(0x1000), True, 8), TypeError, "bool"),
        ((FakeBuffer(0x1000), 1 << 32, 8), cc.InvalidValueError, r"does not fit in .u32"),
        ((FakeBuffer(0x1000), -1, 8), cc.InvalidValueError, r"does not fit in .u32"),
        ((7, FakeBuffer(0x1000), 8), TypeError, "not a 64-bit pointer"),
        ((FakeBuffer(0x1000), cc.float32(1.0), 8), cc.InvalidValueError, r"parameter .u32 v\): got f32"),
        ((FakeBuffer(0x1000), cc.int64(1), 8), cc.InvalidValueError, "it takes 4 bytes"),
        ((FakeBuffer(0x1000), b"\x00\x01", 8), cc.InvalidValueError, "it takes 4 bytes"),
    ],
)
def test_wrong_argument_types(mod, args, exc, match):
    with pytest.raises(exc, match=match) as ei:
        mod.function("fill").launch(grid=1, block=32, args=args)
    if isinstance(ei.value, cc.CUDAError):
        assert ei.value.op == "cudacore.launch", "the check must happen before cuLaunchKernel"


def test_typed_wrappers():
    assert cc.int32(-5).encode() == (-5).to_bytes(4, "little", signed=True)
    assert cc.uint64(2**64 - 1).encode() == b"\xff" * 8
    assert cc.float32(1.5).encode() == bytes.fromhex("0000c03f")
    assert repr(cc.int32(3)) == "cudacore.int32(3)"
    with pytest.raises(cc.InvalidValueError):
        cc.int32(2**31)
    with pytest.raises(cc.InvalidValueError):
        cc.uint8(-1)
    with pytest.raises(TypeError):
        cc.int32(1.5)
    with pytest.raises(TypeError):
        cc.float32("x")


_CODES = ("", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "ptr", "raw")


def _readable(packed: bytes) -> str:
    """The packed launch arguments (code byte, 2-byte length, bytes) as "kind:hex;...", read independently
    of the encoder so that a wrong code or length shows."""
    out, i = [], 0
    while i < len(packed):
        code, n = packed[i], packed[i + 1] | packed[i + 2] << 8
        out.append(f"{_CODES[code]}:{packed[i + 3 : i + 3 + n].hex()}")
        i += 3 + n
    assert i == len(packed), "the last argument runs past the end"
    return ";".join(out)


def test_arguments_follow_the_ptx_types(mod):
    fill, fill_f32 = mod.function("fill"), mod.function("fill_f32")
    # An int for .u32 is 4 bytes; for .u64, 8; a buffer is a pointer.
    assert (
        _readable(fill.encode_args((FakeBuffer(0x1000), 7, 9)))
        == "ptr:0010000000000000;u32:07000000;u64:0900000000000000"
    )
    # An int for a .f32 parameter becomes a float.
    assert _readable(fill_f32.encode_args((FakeArray(0x2000), 2, 9))).split(";")[1] == "f32:00000040"
    assert _readable(fill_f32.encode_args((FakeArray(0x2000), 1.5, 9))).split(";")[1] == "f32:0000c03f"
    with pytest.raises(TypeError):
        fill.encode_args("abc")


@pytest.mark.parametrize(
    ("grid", "block", "shared_mem", "exc", "match"),
    [
        (1, 2048, 0, cc.InvalidValueError, "block dimension x is 2048, above the device's maximum 1024"),
        (1, (64, 64), 0, cc.InvalidValueError, "4,096 threads, above the device's maximum of 1024"),
        (1, (1, 1, 128), 0, cc.InvalidValueError, "block dimension z is 128"),
        (
            (1, 1 << 20),
            32,
            0,
            cc.InvalidValueError,
            "grid dimension y is 1048576, above the device's maximum 65535",
        ),
        (1, 0, 0, cc.InvalidValueError, "at least 1"),
        (1, 32, 1 << 20, cc.InvalidValueError, "1,048,576 bytes of shared memory"),
        (1, 32, -1, cc.InvalidValueError, "at least 0"),
        (1, (1, 2, 3, 4), 0, TypeError, "1 to 3 dimensions"),
        (1.5, 32, 0, TypeError, "ints"),
        (1, 32, 1.0, TypeError, "shared_mem"),
    ],
)
def test_bad_launch_configuration(mod, grid, block, shared_mem, exc, match):
    with pytest.raises(exc, match=match) as ei:
        mod.function("fill").launch(
            grid=grid, block=block, args=(FakeBuffer(0x1000), 7, 8), shared_mem=shared_mem
        )
    if isinstance(ei.value, cc.CUDAError) and "dimension" in match:
        # The message carries the device's limits and the kernel's resources.
        assert "allows 1024 threads per block" in str(ei.value)
        assert "registers per thread" in str(ei.value)


# -- the simulator runs no device code ---------------------------------------------------------------


@pytest.mark.sim
@pytest.mark.parametrize("buf", [FakeBuffer(0x1000), FakeArray(0x1000), cc.pointer(0x1000)])
def test_simulator_launch_is_not_supported(mod, buf):
    with pytest.raises(cc.NotSupportedError, match="the simulator does not run device code") as ei:
        mod.function("fill").launch(grid=4, block=256, args=(buf, 7, 1024))
    assert ei.value.op == "cuLaunchKernel"
    assert ei.value.name == "CUDA_ERROR_NOT_SUPPORTED"


@pytest.mark.sim
def test_simulator_call_form(mod):
    with pytest.raises(cc.NotSupportedError):
        mod.function("fill_f32")((4,), (256,), FakeBuffer(0x1000), 1.5, 1024, stream=None)


# What Kernel.launch packs in C (cudacore._fast.launch) and what it leaves to the general path (NotImplemented,
# nothing done), which checks and explains: fill(.u64 p, .u32 v, .u64 n) and fill_f32(.u64 p, .f32 v, .u64 n).
_PACKED = [
    ("fill", 7),
    ("fill", 2**32 - 1),
    ("fill", np.uint32(7)),
    ("fill", np.int32(7)),
    ("fill", np.uint8(255)),
    ("fill", np.int64(2**32 - 1)),
    ("fill", cc.uint32(7)),
    ("fill", cc.int32(-1)),  # a typed value goes as it is, as the general path sends it
    ("fill_f32", np.float32(1.5)),
    ("fill_f32", np.float64(1e30)),
    ("fill_f32", np.int16(-3)),
    ("fill_f32", np.array(2.5)),  # a 0-d array, as numpy scalars come out of reductions
    ("fill_f32", cc.float32(1.5)),
]
_GENERAL = [
    ("fill", -1),  # out of range: the general path says so
    ("fill", 2**32),
    ("fill", 2**64),
    ("fill", np.int64(-1)),
    ("fill", np.uint64(2**32)),
    ("fill", np.float32(1.0)),  # a float for an integer parameter: refused there
    ("fill", np.bool_(True)),
    ("fill", np.array([7], dtype=np.uint32)),  # not a scalar
    ("fill", cc.uint64(7)),  # a typed value of another size than the parameter
    ("fill_f32", np.float64(1e300)),  # does not fit a float
    ("fill_f32", np.float16(1.0)),
    ("fill_f32", np.complex64(1)),
]


@pytest.mark.sim
@pytest.mark.parametrize(("name", "value"), _PACKED, ids=repr)
def test_numpy_scalars_and_typed_values_pack_in_c(mod, name, value):
    from cudacore._native import fast

    k = mod.function(name)
    with pytest.raises(cc.NotSupportedError):  # packed in C and handed to the launch door: no kernel runs here
        fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (0x1000, value, 16), k._spec)


@pytest.mark.sim
def test_arrays_of_other_libraries_pack_in_c(mod):
    # An object with __cuda_array_interface__ (a CuPy array, a PyTorch tensor) passed for a pointer
    # parameter goes as its device address, in C as in the general path; one whose interface cannot be read
    # goes to the general path, which explains.
    from cudacore._native import fast

    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("no")

    class WithBufferSlot(array.array):
        # CuPy's ndarray has a buffer slot too (one that refuses): the interface decides, not the slot.
        @property
        def __cuda_array_interface__(self):
            return {"shape": (4,), "typestr": "<u4", "data": (0x2000, False), "version": 3}

    k = mod.function("fill")
    for arr in (FakeArray(0x2000), WithBufferSlot("I", [0, 0, 0, 0])):
        with pytest.raises(cc.NotSupportedError):
            fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (arr, 7, 16), k._spec)
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (Broken(), 7, 16), k._spec) is NotImplemented
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (FakeArray(0x2000), FakeArray(0x3000), 16), k._spec) is NotImplemented
    assert _readable(k.encode_args((FakeArray(0x2000), 7, 16))).startswith("ptr:0020000000000000")


@pytest.mark.sim
def test_cupy_arrays_pack_without_their_interface(mod):
    # CuPy's ndarray (class "ndarray" of module "cupy") is read by its data.ptr, as its interface gives it,
    # without building the interface's dictionary; an empty one, or a look-alike of another module, goes
    # by its interface.
    from cudacore._native import fast

    class _Mem:
        def __init__(self, ptr):
            self.ptr = ptr

    def array_class(module):
        class ndarray:  # CuPy's class name
            def __init__(self, ptr, size):
                self.data, self.size = _Mem(ptr), size

            @property
            def __cuda_array_interface__(self):
                if self.size:
                    raise RuntimeError("the interface is not read for a non-empty CuPy array")
                return {"shape": (0,), "typestr": "<u4", "data": (0, False), "version": 3}

        ndarray.__module__ = module
        return ndarray

    k = mod.function("fill")
    cupy_ndarray, other = array_class("cupy"), array_class("notcupy")
    for arr in (cupy_ndarray(0x2000, 4), cupy_ndarray(0x2000, 0)):
        with pytest.raises(cc.NotSupportedError):  # packed in C and handed to the launch door
            fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (arr, 7, 16), k._spec)
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (other(0x2000, 4), 7, 16), k._spec) is NotImplemented


@pytest.mark.sim
def test_torch_tensors_pack_without_their_interface(mod):
    # PyTorch's own tensor types (torch.Tensor, torch.nn.Parameter, by name and module) are read by
    # data_ptr(), as their interface gives it, without calling the interface's Python property, in C and in
    # the general path alike; an empty tensor, one on the CPU, a sparse one, one that requires grad, and a
    # subclass of another module (which may override __torch_function__) go by the interface, which
    # decides (and refuses).
    from cudacore._native import fast

    class Tensor:
        interface_reads = 0

        def __init__(self, ptr, numel, *, is_cuda=True, is_sparse=False, requires_grad=False):
            self.ptr, self.n = ptr, numel
            self.is_cuda, self.is_sparse, self.requires_grad = is_cuda, is_sparse, requires_grad

        def numel(self):
            return self.n

        def data_ptr(self):
            return self.ptr

        @property
        def __cuda_array_interface__(self):
            Tensor.interface_reads += 1
            if self.requires_grad:
                raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")
            return {"shape": (self.n,), "typestr": "<u4", "data": (self.ptr + 0x100 if self.n else 0, False), "version": 3}

    Tensor.__module__ = "torch"

    class Parameter(Tensor):
        pass

    Parameter.__module__ = "torch.nn.parameter"

    class Mine(Tensor):  # a user's subclass: goes by its interface
        pass

    k = mod.function("fill")
    for t in (Tensor(0x2000, 4), Parameter(0x2000, 4)):
        with pytest.raises(cc.NotSupportedError):  # packed in C and handed to the launch door
            fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (t, 7, 16), k._spec)
        assert _readable(k.encode_args((t, 7, 16))).startswith("ptr:0020000000000000"), "the general path agrees"
    assert Tensor.interface_reads == 0
    for t in (Tensor(0x2000, 0), Tensor(0x2000, 4, is_sparse=True), Tensor(0x2000, 4, is_cuda=False), Mine(0x2000, 4)):
        with pytest.raises(cc.NotSupportedError):
            fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (t, 7, 16), k._spec)
    assert Tensor.interface_reads == 4
    assert _readable(k.encode_args((Mine(0x2000, 4), 7, 16))).startswith("ptr:0021000000000000"), "by its interface"
    # The interface refuses a tensor that requires grad: the general path is left to explain.
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (Tensor(0x2000, 4, requires_grad=True), 7, 16), k._spec) is NotImplemented

    class Interrupting(Tensor):
        @property
        def is_cuda(self):
            raise KeyboardInterrupt

        @is_cuda.setter
        def is_cuda(self, value):
            pass

    Interrupting.__module__ = "torch"
    Interrupting.__name__ = "Tensor"
    with pytest.raises(KeyboardInterrupt):  # never swallowed while reading an argument
        fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (Interrupting(0x2000, 4), 7, 16), k._spec)


def _lying_tensor(*, interface: bool, **lies: Any) -> Any:
    """An object of PyTorch's own Tensor class (by name and module) whose reads answer as ``lies`` says: a
    value, or an exception class to raise; with ``interface``, a __cuda_array_interface__ at 0x3000 that
    counts its reads."""

    class Tensor:
        interface_reads = 0

        def _answer(self, name: str, default: Any) -> Any:
            v = lies.get(name, default)
            if isinstance(v, type) and issubclass(v, BaseException):
                raise v(name)
            return v

        is_cuda = property(lambda self: self._answer("is_cuda", True))
        is_sparse = property(lambda self: self._answer("is_sparse", False))
        requires_grad = property(lambda self: self._answer("requires_grad", False))

        def numel(self) -> Any:
            return self._answer("numel", 4)

        def data_ptr(self) -> Any:
            return self._answer("data_ptr", 0x2000)

    def cai(self: Any) -> dict[str, Any]:
        Tensor.interface_reads += 1
        return {"shape": (4,), "typestr": "<u4", "data": (0x3000, False), "version": 3}

    if interface:
        Tensor.__cuda_array_interface__ = property(cai)  # type: ignore[attr-defined]
    Tensor.__module__ = "torch"
    return Tensor()


# What a tensor that is not what it claims answers: data_ptr() or numel() raising an ordinary exception or
# returning what is not an exact int (a float would be truncated into another address, True read as 1),
# and is_sparse raising.
_TENSOR_LIES = [
    {"data_ptr": RuntimeError},
    {"data_ptr": 8192.5},
    {"data_ptr": "0x2000"},
    {"data_ptr": True},
    {"data_ptr": None},
    {"data_ptr": np.uint64(0x2000)},
    {"numel": ValueError},
    {"numel": 4.0},
    {"numel": 2**70},
    {"is_sparse": AttributeError},
]


@pytest.mark.sim
@pytest.mark.parametrize("lies", _TENSOR_LIES, ids=repr)
def test_a_tensor_whose_reads_lie_goes_by_its_interface_in_c_and_in_the_general_path(mod, lies):
    # The C path takes data_ptr() only as an exact int, from a tensor whose numel() is an exact int > 0, and
    # lets the interface decide anything else (an ordinary exception included); the general path must
    # decide the same (it raised the tensor's own exception, or truncated data_ptr() with int()), since it
    # packs the same arguments whenever another argument sends the launch its way. Without an interface the
    # argument is refused with a TypeError, by the general path.
    from cudacore._native import fast

    k = mod.function("fill")
    t = _lying_tensor(interface=True, **lies)
    with pytest.raises(cc.NotSupportedError):  # packed in C, by its interface
        fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (t, 7, 16), k._spec)
    assert type(t).interface_reads == 1
    assert _readable(k.encode_args((t, 7, 16))).startswith("ptr:0030000000000000"), "the general path agrees"
    assert type(t).interface_reads == 2
    bare = _lying_tensor(interface=False, **lies)
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (bare, 7, 16), k._spec) is NotImplemented
    with pytest.raises(TypeError, match="cannot pass Tensor"):
        k.encode_args((bare, 7, 16))


@pytest.mark.sim
@pytest.mark.parametrize("read", ["is_cuda", "numel", "data_ptr"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
def test_an_interrupt_or_memory_error_reading_a_tensor_is_raised_by_both_paths(mod, read, exc):
    from cudacore._native import fast

    k = mod.function("fill")
    t = _lying_tensor(interface=True, **{read: exc})
    with pytest.raises(exc):
        fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (t, 7, 16), k._spec)
    with pytest.raises(exc):
        k.encode_args((t, 7, 16))
    assert type(t).interface_reads == 0


@pytest.mark.sim
@pytest.mark.parametrize(("name", "value"), _GENERAL, ids=repr)
def test_other_arguments_take_the_general_path(mod, name, value):
    from cudacore._native import fast

    k = mod.function(name)
    assert fast.launch(k._handle, 1, 1, 1, 1, 1, 1, 0, 0, (0x1000, value, 16), k._spec) is NotImplemented


# -- on a real GPU --------------------------------------------------------------------------------

# Device buffers for the GPU scripts: CuPy (on the GPU machine) or cudacore's own allocator. Both use the
# device's primary context, as cudacore does, so their pointers are valid in cudacore's launches.
_BUFFERS = textwrap.dedent(
    """
    import numpy as np
    import cudacore as cc
    d = cc.Device(0)

    def zeros(n, dtype):
        try:
            import cupy
        except ImportError:
            buf = d.allocate(n * np.dtype(dtype).itemsize)
            buf.copy_from(np.zeros(n, dtype))
            def read():
                host = np.empty(n, dtype)
                buf.copy_to(host)
                return host
            return buf, read
        a = cupy.zeros(n, dtype)
        def read():
            cupy.cuda.runtime.deviceSynchronize()
            return a.get()
        return a, read
    """
)


def _gpu(code: str, timeout: float = 120) -> dict:
    r = run_python(_BUFFERS + textwrap.dedent(code), env={"CUDACORE_BACKEND": "cuda"}, timeout=timeout)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _heap_run(heap: int | None) -> dict:
    if not HEAP_PTX.exists():
        pytest.skip(f"{HEAP_PTX.name} is missing: run scripts/gpu/build_ptx.sh on the GPU machine")
    return _gpu(
        f"""
        import json
        HEAP = {heap!r}
        if HEAP is not None:
            d.limits.malloc_heap_size = HEAP
        heap_before = d.limits.malloc_heap_size
        k = d.load_module({str(HEAP_PTX)!r}).function("heap_malloc")
        nulls, read = zeros(1, np.uint32)
        k.launch(grid=1024, block=256, args=(nulls, 1024))
        count = int(read()[0])
        rule = None
        try:
            d.limits.malloc_heap_size = 2 << 30
        except cc.InvalidValueError as e:
            rule = str(e)
        print(json.dumps({{"nulls": count, "heap": heap_before, "heap_after": d.limits.malloc_heap_size, "rule": rule}}))
        """
    )


@pytest.mark.gpu
def test_gpu_heap_default_runs_out_and_is_then_fixed():
    out = _heap_run(None)
    print(
        f"\nheap_malloc, default heap {out['heap']:,} bytes: {out['nulls']:,} NULLs of 262,144 mallocs of 1 KiB"
    )
    assert out["heap"] == 8_388_608
    assert out["nulls"] > 0  # docs/contributing/driver-facts.md: 258,366
    # After a kernel that used malloc has run, the heap is fixed: the error states the rule.
    assert out["rule"] is not None, "setting the heap after a malloc kernel must fail"
    assert "fixed once a kernel that uses device malloc has been launched" in out["rule"]
    assert out["heap_after"] == 8_388_608
    print(f"set after the kernel: {out['rule']}")


@pytest.mark.gpu
def test_gpu_heap_raised_first_has_no_nulls():
    out = _heap_run(1 << 30)
    print(f"\nheap_malloc, heap raised to {out['heap']:,} bytes first: {out['nulls']:,} NULLs of 262,144")
    assert out["heap"] == 1 << 30
    assert out["nulls"] == 0


@pytest.mark.gpu
def test_gpu_limits_defaults_and_clamp():
    out = _gpu(
        """
        import json, warnings
        defaults = d.limits.as_dict()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            d.limits.malloc_heap_size = 64 << 40
        clamp = [str(w.message) for w in rec]
        applied = d.limits.malloc_heap_size
        strict = None
        try:
            with d.limits.strict_mode():
                d.limits.malloc_heap_size = 64 << 40
        except cc.InvalidValueError as e:
            strict = str(e)
        print(json.dumps({"defaults": defaults, "clamp": clamp, "applied": applied, "strict": strict}))
        """
    )
    print(f"\nlimits on the GPU: {out['defaults']}\nclamp warning: {out['clamp']}\nstrict: {out['strict']}")
    assert out["defaults"]["malloc_heap_size"] == 8_388_608
    assert out["defaults"]["stack_size"] == 1024
    assert out["defaults"]["printf_fifo_size"] == 8_650_752
    assert len(out["clamp"]) == 1 and "asked 70,368,744,177,664 bytes (64.0 TiB)" in out["clamp"][0]
    assert out["applied"] < 64 << 40  # docs/contributing/driver-facts.md: 17,681,179,680 on the H100
    assert out["strict"] is not None and "restored" in out["strict"]


@pytest.mark.gpu
def test_gpu_numpy_scalars_and_typed_values_reach_the_kernel():
    # Each argument form, on the direct path (a Stream of cudacore's, explicit or current under `with s:`,
    # after a first launch through Go) and through Go: the kernel writes the value it was given.
    out = _gpu(
        f"""
        import json
        m = d.load_module({str(FILL_PTX)!r})
        fill, fill_f32 = m.function("fill"), m.function("fill_f32")
        s = d.create_stream()
        got = {{}}
        for label, v in (("py", 7), ("np.uint32", np.uint32(8)), ("np.int64", np.int64(9)), ("cc.uint32", cc.uint32(10))):
            for how in ("go", "direct", "with"):
                a, read_a = zeros(64, np.uint32)
                if how == "with":
                    with s:
                        fill.launch(grid=1, block=64, args=(a, v, 64))
                else:
                    fill.launch(grid=1, block=64, args=(a, v, 64), stream=s if how == "direct" else None)
                s.synchronize()
                got[f"u32 {{label}} {{how}}"] = int(read_a()[0])
        for label, v in (("np.float32", np.float32(1.5)), ("np.float64", np.float64(2.5)), ("cc.float32", cc.float32(3.5))):
            b, read_b = zeros(64, np.float32)
            fill_f32.launch(grid=1, block=64, args=(b, v, 64), stream=s)
            s.synchronize()
            got[f"f32 {{label}}"] = float(read_b()[0])
        print(json.dumps(got))
        """
    )
    assert out == {
        **{f"u32 {label} {how}": want for label, want in (("py", 7), ("np.uint32", 8), ("np.int64", 9), ("cc.uint32", 10))
           for how in ("go", "direct", "with")},
        "f32 np.float32": 1.5, "f32 np.float64": 2.5, "f32 cc.float32": 3.5,
    }  # fmt: skip


#: Per library: how the GPU script makes a zeroed array of 64 32-bit ints, reads it back, and what of the
#: library's arrays the interface refuses (checked that the launch refuses it too), or None.
_VIEW_LIBRARIES = {
    "cupy": ("cupy.zeros(64, cupy.uint32)", "a.get().tolist()", None),
    "torch": ('torch.zeros(64, dtype=torch.int32, device="cuda")', "a.cpu().tolist()",
              'torch.zeros(4, device="cuda", requires_grad=True)'),
}


@pytest.mark.gpu
@pytest.mark.parametrize("lib", sorted(_VIEW_LIBRARIES))
def test_gpu_views_of_other_libraries_reach_the_kernel(lib):
    # A CuPy array or a PyTorch tensor passed for a pointer goes as the address its interface gives: a
    # view's own start, on the direct path and through Go alike. A tensor that requires grad is refused as
    # its interface refuses it.
    pytest.importorskip(lib)
    zeros, read, refused = _VIEW_LIBRARIES[lib]
    refusal = f"""
        try:
            fill.launch(grid=1, block=32, args=({refused}, 1, 4), stream=s)
            got["refused"] = "launched"
        except Exception as e:
            got["refused"] = type(e).__name__""" if refused else ""
    out = _gpu(
        f"""
        import json, {lib}
        fill = d.load_module({str(FILL_PTX)!r}).function("fill")
        s = d.create_stream()
        got = {{}}
        for how in ("go", "direct"):
            a = {zeros}
            fill.launch(grid=1, block=32, args=(a[16:], 5, 16), stream=s if how == "direct" else None)
            fill.launch(grid=1, block=32, args=(a[40:48], 6, 8), stream=s if how == "direct" else None)
            s.synchronize()
            got[how] = {read}
        {refusal}
        print(json.dumps(got))
        """
    )
    want = [0] * 16 + [5] * 16 + [0] * 8 + [6] * 8 + [0] * 16
    assert out["go"] == want and out["direct"] == want
    if refused is not None:
        assert out["refused"] != "launched"


@pytest.mark.gpu
@pytest.mark.parametrize("ptx", ["fill.ptx", "fill_nvcc.ptx"])
def test_gpu_fill_launch_and_read_back(ptx):
    path = KERNELS / ptx
    if not path.exists():
        pytest.skip(f"{ptx} is missing: run scripts/gpu/build_ptx.sh on the GPU machine")
    out = _gpu(
        f"""
        import json
        m = d.load_module({str(path)!r})
        n = 1000
        a, read_a = zeros(1024, np.uint32)
        m.function("fill").launch(grid=4, block=256, args=(a, 7, n))
        ha = read_a()
        b, read_b = zeros(1024, np.float32)
        m.function("fill_f32").launch(grid=8, block=128, args=(b, 2, n))  # an int for a float parameter
        hb = read_b()
        errors = {{}}
        for name, block in (("fill", 2048), ("fill_f32", 512)):
            try:
                m.function(name).launch(grid=1, block=block, args=(a, 1, n))
            except cc.CUDAError as e:
                errors[name] = [type(e).__name__, e.op, str(e)]
        attrs = m.function("fill_f32").attributes.as_dict()
        print(json.dumps({{"a_ok": bool((ha[:n] == 7).all() and (ha[n:] == 0).all()),
                          "b_ok": bool((hb[:n] == 2.0).all() and (hb[n:] == 0).all()),
                          "errors": errors, "attrs": attrs}}))
        """
    )
    print(f"\n{ptx}: fill_f32 attributes {out['attrs']}")
    assert out["a_ok"] and out["b_ok"]
    assert out["errors"]["fill"][:2] == ["InvalidValueError", "cudacore.launch"]
    assert "above the device's maximum 1024" in out["errors"]["fill"][2]
    # fill_f32 allows at most 256 threads per block (.maxntid / __launch_bounds__): refused before the driver.
    assert out["attrs"]["max_threads_per_block"] <= 256
    assert out["errors"]["fill_f32"][:2] == ["InvalidValueError", "cudacore.launch"]
    assert "this kernel allows" in out["errors"]["fill_f32"][2]


def test_launch_obeys_the_capture_rules_and_refuses_dead_streams():
    """A launch on the legacy stream while a blocking stream captures would be the driver's 906: refused
    first, the capture intact. A launch on a closed stream never reaches the driver (the real one
    crashes on a destroyed stream's handle)."""
    d = cc.Device(0)
    mod = d.load_module(FILL_PTX)
    k = mod.function("fill")
    buf = d.allocate(4096)
    s = d.create_stream(non_blocking=False)
    try:
        with pytest.raises(cc.CaptureError, match="906"), s.capture():
            k.launch(grid=4, block=256, args=(buf, 7, 1024))  # stream=None: the legacy stream
        assert not s.capturing
        s.synchronize()  # the stream works again
        closed = d.create_stream()
        closed.close()
        with pytest.raises(cc.InvalidHandleError, match="was destroyed"):
            k.launch(grid=4, block=256, args=(buf, 7, 1024), stream=closed.handle)
    finally:
        s.close()
        buf.close()
        mod.unload()


def test_the_argument_codes_agree_across_languages():
    # Go owns the kind codes of packed launch arguments (pkg/module.ArgCodes, which unpacks them); tablegen
    # writes them for Python (_tables.ARG_KINDS, which the general path packs by) and C (tables_gen.h, the
    # packer's constants), and its Go test checks both files are current. Here: Python's table is the
    # generated one, the generated C names the same codes, and the C packer compares codes only by those
    # names, never by a number of its own.
    import re

    from cudacore import _module, _tables

    assert _module._ARG_CODES == {k: i for i, k in enumerate(_tables.ARG_KINDS)}
    h = (ROOT / "cudacore" / "native" / "tables_gen.h").read_text()
    c_codes = {m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"#define CC_ARG_([A-Z0-9]+) (\d+)", h) if m.group(1) != "KINDS"}
    assert c_codes == {k: i for i, k in enumerate(_tables.ARG_KINDS) if k}
    c = (ROOT / "cudacore" / "native" / "launch.c").read_text()
    assert not re.search(r"\bcode\s*[=!<>]=?\s*\d", c), "a kind code compared by number in the C packer"
    assert "code == CC_ARG_I8 || code == CC_ARG_I16 || code == CC_ARG_I32 || code == CC_ARG_I64" in c
    assert c.count("int signed_kind = code ==") == 1, "the packer tests signedness in one place, checked here"

"""The error contract: wire text from Go becomes typed, picklable exceptions."""

from __future__ import annotations

import gc
import pickle
import traceback

import pytest

import cudacore as cc
from cudacore import _errors


def test_shared_wire_examples_decode_like_go(wire_examples: list[dict]) -> None:
    for ex in wire_examples:
        parts = _errors.decode(ex["wire"])
        assert parts is not None, ex["wire"]
        assert parts["code"] == ex["code"]
        assert parts["name"] == ex["name"]
        assert parts["op"] == ex["op"]
        assert parts["fields"] == ex["fields"]
        assert parts["message"] == ex["message"]
        assert _errors.category(ex["code"]) == ex["category"]


@pytest.mark.parametrize(
    ("code", "cls", "builtin"),
    [
        (2, cc.OutOfMemoryError, MemoryError),
        (1, cc.InvalidValueError, ValueError),
        (101, cc.InvalidValueError, ValueError),
        (906, cc.CaptureError, RuntimeError),
        (901, cc.CaptureError, RuntimeError),
        (801, cc.NotSupportedError, RuntimeError),
        (-1, cc.DriverNotFoundError, RuntimeError),
        (701, cc.LaunchError, RuntimeError),
        (700, cc.DeviceFaultError, RuntimeError),
        (500, cc.NotFoundError, LookupError),
        (12345, cc.CUDAError, RuntimeError),
    ],
)
def test_codes_map_to_classes(code: int, cls: type, builtin: type) -> None:
    name = _errors.RESULTS.get(code, (f"CUresult({code})",))[0]
    raw = RuntimeError(f"cuda[{code} {name} cuTest]{{device=0}}: something failed")
    typed = _errors.from_runtime_error(raw)
    assert type(typed) is cls
    assert isinstance(typed, cc.CUDAError)
    assert isinstance(typed, builtin)
    assert typed.code == code
    assert typed.name == name
    assert typed.op == "cuTest"
    assert typed.fields == {"device": "0"}
    assert str(typed) == "something failed"


def test_non_wire_runtime_error_is_left_alone() -> None:
    raw = RuntimeError("some other failure")
    assert _errors.from_runtime_error(raw) is raw
    other = KeyError("x")
    assert _errors.from_runtime_error(other) is other


def test_out_of_memory_attributes_and_pickle() -> None:
    raw = RuntimeError(
        "cuda[2 CUDA_ERROR_OUT_OF_MEMORY cuMemAllocAsync]{requested=2199023255552 free=84465090560 "
        "total=85017493504 device=0 in_use=0 cached=1048576}: out of memory allocating 2.0 TiB"
    )
    exc = _errors.from_runtime_error(raw)
    assert isinstance(exc, cc.OutOfMemoryError)
    assert isinstance(exc, MemoryError)
    assert (exc.requested, exc.free, exc.total, exc.device) == (2199023255552, 84465090560, 85017493504, 0)
    assert (exc.in_use, exc.cached, exc.limit) == (0, 1048576, None)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cc.OutOfMemoryError
    assert str(back) == str(exc)
    assert (back.code, back.name, back.op, back.requested) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAllocAsync", 2199023255552)


@pytest.mark.parametrize("cls", [cc.CUDAError, cc.CaptureError, cc.InvalidValueError, cc.DriverNotFoundError])
def test_every_class_pickles(cls: type) -> None:
    exc = cls("msg", code=906, name="CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", op="cuMemcpyDtoH_v2", fields={"a": "1"})
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert (str(back), back.code, back.name, back.op, back.fields) == ("msg", 906, exc.name, exc.op, {"a": "1"})


def test_typed_error_from_go_is_raised_alone_with_its_fields() -> None:
    """Issue 31: a Go error reaches the user once, as cudacore.<Name>, with no chained RuntimeError that
    repeats it in wire form; the wire form's parts stay on the typed error."""
    with pytest.raises(cc.InvalidValueError) as info:
        cc.Device(0).limits.malloc_heap_size = -1
    exc = info.value
    assert exc.__cause__ is None and exc.__suppress_context__
    assert (exc.code, exc.name, exc.op) == (1, "CUDA_ERROR_INVALID_VALUE", "cudacore.limits")
    assert exc.fields == {"limit": "malloc_heap_size", "requested": "-1"}
    shown = "".join(traceback.format_exception(exc))
    assert "RuntimeError" not in shown and "direct cause" not in shown and "cuda[1 " not in shown
    assert shown.count("a limit cannot be negative") == 1
    assert "\ncudacore.InvalidValueError: malloc_heap_size = -1 is not valid" in shown


@pytest.mark.parametrize("cls", [getattr(cc, name) for name in cc.__all__ if name.endswith("Error")])
def test_error_classes_are_public_and_pickle_by_their_public_name(cls: type) -> None:
    assert (cls.__module__, cls.__qualname__) == ("cudacore", cls.__name__)
    assert f"cudacore\n{cls.__name__}".encode() in pickle.dumps(cls("m"), protocol=0)
    back = pickle.loads(pickle.dumps(cls("m", code=1, name="CUDA_ERROR_INVALID_VALUE", op="op", fields={"k": "v"})))
    assert type(back) is cls and (str(back), back.fields) == ("m", {"k": "v"})


def _fails_holding(dev: cc.Device, n: int) -> None:
    held = dev.allocate(n)  # a local of a frame in the error's traceback
    dev.allocate(1 << 50)
    held.close()


def test_an_out_of_memory_error_holds_no_reference_cycle(dev: cc.Device) -> None:
    """The frames of an error's traceback are freed with the error, not at the next garbage collection:
    the funnel that raises it keeps no reference to it."""
    before = dev.memory_stats()["in_use"]
    gc.disable()
    try:
        try:
            _fails_holding(dev, 1 << 20)
        except cc.OutOfMemoryError:
            pass
        assert dev.memory_stats()["in_use"] == before
    finally:
        gc.enable()

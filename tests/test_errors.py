"""The error contract: wire text from Go becomes typed, picklable exceptions."""

from __future__ import annotations

import pickle

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


def test_typed_error_from_go_keeps_cause() -> None:
    with pytest.raises(cc.InvalidValueError) as info:
        cc.Device(10_000)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__).startswith("cuda[1 CUDA_ERROR_INVALID_VALUE ")
    assert "device 10000 does not exist" in str(info.value)

"""Device limits (issue 5): defaults, read-back, clamping, strict mode, override, bad input.

The simulator models the limits as measured on the H100 (docs/contributing/driver-facts.md); the heap proof on a real
GPU is in test_kernels.py.
"""

from __future__ import annotations

import platform
import warnings

import pytest

import cudacore as cc

from conftest import run_cli, run_python

pytestmark = pytest.mark.sim

H100_HEAP_CLAMP = 17_681_179_680  # 64 TiB asked, applied on the H100 of docs/contributing/driver-facts.md
# The most bytes a process can address here (pkg/limits: 47 bits on x86-64 Linux, 48 on aarch64): a byte
# limit above it is refused by name.
ADDRESS_SPACE = 1 << (48 if platform.machine() == "aarch64" else 47)


@pytest.fixture
def limits():
    lim = cc.Device(0).limits
    before = lim.as_dict()
    yield lim
    lim.strict = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cc.LimitClampedWarning)
        for name, value in before.items():
            if value is not None and lim.get(name) != value:
                lim.set(name, value)


def test_defaults_match_driver_facts(limits):
    assert limits.malloc_heap_size == 8_388_608
    assert limits.stack_size == 1024
    assert limits.printf_fifo_size == 8_650_752
    d = limits.as_dict()
    assert list(d) == [
        "malloc_heap_size",
        "stack_size",
        "printf_fifo_size",
        "dev_runtime_sync_depth",
        "dev_runtime_pending_launch_count",
        "max_l2_fetch_granularity",
        "persisting_l2_cache_size",
    ]
    # The H100 (and so the simulated one) does not support the device-runtime sync depth: None.
    assert d["dev_runtime_sync_depth"] is None
    assert all(isinstance(v, int) for k, v in d.items() if k != "dev_runtime_sync_depth")


def test_same_limits_object_per_device():
    assert cc.Device(0).limits is cc.Device(0).limits
    assert isinstance(cc.Device(0).limits, cc.Limits)


def test_set_reads_back(limits):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        limits.malloc_heap_size = 256 << 20
        assert limits.malloc_heap_size == 268_435_456
        assert limits.set("stack_size", 4096) == 4096
        limits["printf_fifo_size"] = 16 << 20
        assert limits["printf_fifo_size"] == 16 << 20


def test_clamp_warns_with_both_numbers(limits):
    with pytest.warns(cc.LimitClampedWarning) as rec:
        limits.malloc_heap_size = 64 << 40
    w = rec[0].message
    assert isinstance(w, UserWarning)
    assert w.requested == 64 << 40 and w.applied == H100_HEAP_CLAMP and w.name == "malloc_heap_size"
    text = str(w)
    assert "asked 70,368,744,177,664 bytes (64.0 TiB)" in text
    assert "applied 17,681,179,680 bytes (16.5 GiB)" in text
    assert rec[0].filename == __file__, "the warning points at the caller's line"
    assert limits.malloc_heap_size == H100_HEAP_CLAMP


@pytest.mark.parametrize("how", ["attribute", "context", "argument"])
def test_strict_clamp_raises_and_restores(limits, how):
    limits.malloc_heap_size = 32 << 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(cc.InvalidValueError) as ei:
            if how == "attribute":
                limits.strict = True
                limits.malloc_heap_size = 64 << 40
            elif how == "context":
                with limits.strict_mode():
                    limits.malloc_heap_size = 64 << 40
            else:
                limits.set("malloc_heap_size", 64 << 40, strict=True)
    assert "asked 70,368,744,177,664 bytes (64.0 TiB), applied 17,681,179,680 bytes (16.5 GiB)" in str(
        ei.value
    )
    assert ei.value.fields["applied"] == str(H100_HEAP_CLAMP)
    assert limits.malloc_heap_size == 32 << 20, "strict mode restores the previous value"
    if how == "context":
        assert limits.strict is False


def test_override_restores(limits):
    before = limits.as_dict()
    with limits.override(malloc_heap_size=1 << 30, stack_size=4096) as lim:
        assert lim.malloc_heap_size == 1 << 30
        assert lim.stack_size == 4096
    assert limits.as_dict() == before


def test_override_restores_on_exception(limits):
    before = limits.as_dict()
    with pytest.raises(KeyError), limits.override(stack_size=8192, printf_fifo_size=32 << 20):
        assert limits.stack_size == 8192
        raise KeyError("boom")
    assert limits.as_dict() == before


def test_override_unknown_or_bad_changes_nothing(limits):
    before = limits.as_dict()
    with (
        pytest.raises(cc.InvalidValueError, match="unknown limit 'heap'.*malloc_heap_size"),
        limits.override(stack_size=8192, heap=1),
    ):
        pass
    # stack_size is valid, the second value is not: the first is undone.
    with pytest.raises(cc.InvalidValueError), limits.override(stack_size=8192, max_l2_fetch_granularity=100):
        pass
    assert limits.as_dict() == before


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("malloc_heap_size", -1, "cannot be negative"),
        ("stack_size", -4096, "cannot be negative"),
        ("malloc_heap_size", 1 << 50, f"larger than the {ADDRESS_SPACE:,} bytes"),
        ("malloc_heap_size", 1 << 70, "larger than any device can hold"),
        ("stack_size", 1 << 20, "local memory"),
        ("max_l2_fetch_granularity", 100, "0, 32, 64, 128"),
        ("dev_runtime_sync_depth", 100, "24 levels"),
        ("persisting_l2_cache_size", 1 << 30, "MAX_PERSISTING_L2_CACHE_SIZE"),
    ],
)
def test_bad_values_are_invalid_value(limits, name, value, match):
    before = limits.as_dict()
    with pytest.raises(cc.InvalidValueError, match=match) as ei:
        limits.set(name, value)
    assert isinstance(ei.value, ValueError)
    assert limits.as_dict() == before


def test_unknown_name_lists_the_limits(limits):
    with pytest.raises(cc.InvalidValueError) as ei:
        limits.set("heap_size", 1)
    for name in ("malloc_heap_size", "stack_size", "printf_fifo_size", "persisting_l2_cache_size"):
        assert name in str(ei.value)
    with pytest.raises(cc.InvalidValueError, match="unknown limit"):
        limits.get("nope")
    with pytest.raises(AttributeError, match="malloc_heap_size"):
        limits.heap = 1


@pytest.mark.parametrize("value", [1.5, "256", None, True, [1]])
def test_wrong_types_are_type_errors(limits, value):
    with pytest.raises(TypeError):
        limits.stack_size = value
    with pytest.raises(TypeError):
        limits.set(42, 1)


def test_unsupported_limit_is_not_supported():
    # A compute capability 7.0 device has no persisting L2 cache.
    r = run_python(
        "import cudacore as cc\n"
        "d = cc.Device(0)\n"
        "assert d.limits.as_dict()['persisting_l2_cache_size'] is None\n"
        "try:\n"
        "    d.limits.persisting_l2_cache_size\n"
        "except cc.NotSupportedError as e:\n"
        "    print('OK', e)\n",
        env={
            "CUDACORE_BACKEND": "sim",
            "CUDACORE_SIM_DEVICES": '[{"name": "sim-volta", "compute_capability": [7, 0]}]',
        },
    )
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and "does not support the limit persisting_l2_cache_size" in r.stdout


def test_doctor_shows_every_limit():
    r = run_cli(["doctor"], env={"CUDACORE_BACKEND": "sim"})
    assert r.returncode == 0, r.stderr
    assert "limits" in r.stdout
    for name in ("malloc_heap_size", "stack_size", "printf_fifo_size", "dev_runtime_sync_depth",
                 "dev_runtime_pending_launch_count", "max_l2_fetch_granularity", "persisting_l2_cache_size"):  # fmt: skip
        assert name in r.stdout
    assert "8,388,608 bytes (8.0 MiB)" in r.stdout

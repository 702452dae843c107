"""cudacore: CUDA devices, memory, streams, graphs and limits for Python, from a Go core.

>>> import cudacore as cc
>>> d = cc.Device(0)
>>> d.name, d.allocation_strategy
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._broker import SharedPool, Wiring, share_pool, shared_pool
from ._capture_tools import CaptureDiagnosis, Graphed, GraphedOutputs, graphed, rehearse
from ._copy import device_to_device
from ._device import (
    Device,
    backend,
    current_device,
    device_count,
    devices,
    driver_version,
    is_available,
    unavailable_reason,
)
from ._diagnostics import (
    configure_flight_recorder,
    flight_record,
    format_flight_record,
    log_allocations,
    memory_summary,
    plot_flight_record,
)
from ._display import MemoryStatsFields
from ._errors import (
    CaptureError,
    CUDAError,
    DeviceFaultError,
    DriverNotFoundError,
    IllegalStateError,
    InvalidHandleError,
    InvalidImageError,
    InvalidValueError,
    LaunchError,
    NotFoundError,
    NotInitializedError,
    NotReadyError,
    NotSupportedError,
    OutOfMemoryCause,
    OutOfMemoryError,
)
from ._explain import explain_oom
from ._ipc import ImportedBuffer, IpcHandle, SharedBuffer
from ._limits import LimitClampedWarning, Limits
from ._memory import Buffer, BufferView, ManagedBuffer, PinnedBuffer
from ._module import (
    Kernel,
    KernelArg,
    KernelAttributes,
    Module,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    pointer,
    uint8,
    uint16,
    uint32,
    uint64,
)
from ._notebook import MemoryRecorder, MemoryStats
from ._stream import (
    CaptureMode,
    CudaStreamProtocol,
    Event,
    EventHandle,
    Graph,
    Stream,
    StreamLike,
    current_stream,
)
from ._version import __version__ as __version__
from .interop import ExternalBuffer, asbuffer

if TYPE_CHECKING:
    from . import testing as testing

__all__ = [
    "Buffer",
    "BufferView",
    "CUDAError",
    "CaptureDiagnosis",
    "CaptureError",
    "CaptureMode",
    "CudaStreamProtocol",
    "Device",
    "DeviceFaultError",
    "DriverNotFoundError",
    "Event",
    "EventHandle",
    "ExternalBuffer",
    "Graph",
    "Graphed",
    "GraphedOutputs",
    "IllegalStateError",
    "ImportedBuffer",
    "InvalidHandleError",
    "InvalidImageError",
    "InvalidValueError",
    "IpcHandle",
    "Kernel",
    "KernelArg",
    "KernelAttributes",
    "LaunchError",
    "LimitClampedWarning",
    "Limits",
    "ManagedBuffer",
    "MemoryRecorder",
    "MemoryStats",
    "MemoryStatsFields",
    "Module",
    "NotFoundError",
    "NotInitializedError",
    "NotReadyError",
    "NotSupportedError",
    "OutOfMemoryCause",
    "OutOfMemoryError",
    "PinnedBuffer",
    "SharedBuffer",
    "SharedPool",
    "Stream",
    "StreamLike",
    "Wiring",
    "asbuffer",
    "backend",
    "configure_flight_recorder",
    "current_device",
    "current_stream",
    "device_count",
    "device_to_device",
    "devices",
    "driver_version",
    "explain_oom",
    "flight_record",
    "float16",
    "float32",
    "float64",
    "format_flight_record",
    "graphed",
    "int8",
    "int16",
    "int32",
    "int64",
    "is_available",
    "log_allocations",
    "memory_summary",
    "plot_flight_record",
    "pointer",
    "rehearse",
    "share_pool",
    "shared_pool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "unavailable_reason",
]


def __getattr__(name: str) -> object:
    # cudacore.testing is reachable as an attribute without importing it by name first; it is imported
    # on first use only (so is its module, as ``import cudacore.testing`` would).
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

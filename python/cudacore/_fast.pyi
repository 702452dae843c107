"""Type stub for cudacore._fast: the C module of cudacore/native/fast.c and the METH_FASTCALL wrappers
that bindings/door generates from the facade's declarations (listed last; a Go test checks them)."""

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal, TypeVar

from typing_extensions import Buffer as _BufferLike
from typing_extensions import Self

from cudacore._stream import StreamLike

_B = TypeVar("_B", bound=Buffer)

class Use:
    """A use of Buffers by one call: see :func:`using`."""

    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...

def using(buffer: object, other: object = None, /) -> Use:
    """While the block runs, ``close()`` of the Buffers given (anything else is ignored) waits on another
    thread, and is refused on this one: for calls that use their memory with the GIL released."""

class Buffer:
    """Device memory owned by this object (subclassed by cudacore.Buffer)."""

    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def stream_handle(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    _graph_token: int  # Go's owner token of an allocation made during a capture (cudacore internal)
    @property
    def owner(self) -> Any: ...
    @property
    def borrowed(self) -> bool: ...
    @property
    def _views(self) -> int: ...  # open views (buf[start:stop]) of this buffer: close() refuses meanwhile
    def _view(self, offset: int, size: int, type: type[_B], /) -> _B: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def copy_from(
        self,
        src: Any,
        stream: StreamLike = None,
        *,
        nbytes: int | None = None,
        offset: int = 0,
        src_offset: int = 0,
    ) -> None:
        """Copy ``src`` into this buffer at ``offset``: host memory (bytes-like, a numpy array, a
        PinnedBuffer), a device Buffer, or an array of the CUDA Array Interface or DLPack; ``nbytes`` of it
        from ``src_offset`` (None: the rest of ``src``, which must be this buffer's size from ``offset``). With ``stream=None`` on the current stream and
        synchronous, else ordered on ``stream``."""
    def copy_to(
        self,
        dst: Any,
        stream: StreamLike = None,
        *,
        nbytes: int | None = None,
        offset: int = 0,
        dst_offset: int = 0,
    ) -> None:
        """Copy this buffer from ``offset`` into ``dst`` at ``dst_offset``: writable host memory (a
        bytearray, a numpy array, a PinnedBuffer), a device Buffer, or an array of the CUDA Array Interface
        or DLPack; ``nbytes`` of it (None: all of it from ``offset``, which must be ``dst``'s size from ``dst_offset``). With ``stream=None`` on the current stream and
        synchronous, else ordered on ``stream``."""

class PinnedBuffer:
    """Page-locked host memory with the buffer protocol (subclassed by cudacore.PinnedBuffer)."""

    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

# The C bases of the Python layer's classes: the fields the fast path reads, and the hot methods, whose
# general path is the subclass's method of the same name with a leading underscore (_synchronize, ...).
class Device:
    """The fields of a CUDA device the fast path reads (subclassed by cudacore.Device)."""

    _ordinal: int

class Stream:
    """The fields and hot methods of a CUDA stream (subclassed by cudacore.Stream)."""

    _device: Any
    _handle: int
    _owned: bool
    _closed: bool
    def synchronize(self) -> None:
        """Wait until all work on the stream has finished."""
    def query(self) -> bool:
        """Whether all work on the stream has finished (without waiting)."""

class Event:
    """The fields and hot methods of a CUDA event (subclassed by cudacore.Event)."""

    _device: Any
    _handle: int
    def synchronize(self) -> None:
        """Wait for the work the event recorded."""
    def query(self) -> bool:
        """Whether the work the event recorded has finished."""

class Graph:
    """The fields and hot method of a CUDA graph (subclassed by cudacore.Graph)."""

    _device: Any
    _exec: int
    def launch(self, stream: StreamLike = None) -> None:
        """Launch the graph on ``stream`` (None: the current stream of the graph's device)."""

class Module:
    """The fields of a loaded kernel image the fast path reads (subclassed by cudacore.Module)."""

    _device: Any
    _loaded: bool

class Kernel:
    """The fields and hot method of a kernel function (subclassed by cudacore.Kernel)."""

    _direct: int
    _module: Any
    _spec: bytes | None
    def launch(
        self,
        grid: int | Sequence[int] = 1,
        block: int | Sequence[int] = 1,
        args: Sequence[Any] = (),
        shared_mem: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """Launch the kernel asynchronously on ``stream`` (None: the current stream of the kernel's device)."""

class KernelArg:
    """The fields of a typed kernel argument the launch packs (subclassed by cudacore.KernelArg)."""

    _code: int
    _raw: bytes

def allocate(device: int, size: int, stream: int, /) -> Any: ...
def device_allocate(device: int, size: int, stream: object, /) -> Any: ...
def thread_streams() -> dict[int, Any]: ...
def configure_streams(handles_dict: dict[str, Any], stream_handle: Callable[[object, int], int], note: Callable[[Any], None], /) -> None: ...
def allocate_pinned(device: int, size: int, /) -> Any: ...
def wrap(device: int, ptr: int, size: int, stream: int, type: type = ..., /) -> Any: ...
def borrow(type: type[_B], device: int, ptr: int, size: int, stream: int, owner: object, /) -> _B: ...
def call(fn: Callable[..., Any], /, *args: Any) -> Any: ...

#: The cold door's generated METH_FASTCALL wrappers of gopy's exports, named like gopy's C functions
#: (``cold.cudacore_Noop``); cudacore._native.core holds them.
cold: ModuleType
def launch(
    function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared_mem: int, stream: int,
    args: Any, spec: bytes, /,
) -> Any: ...
def configure(buffer_type: type[Buffer], pinned_type: type[PinnedBuffer], funnel: object, /) -> None: ...
def capturing() -> bool: ...
def direct_enabled(device: int, /) -> bool: ...
def forked() -> bool: ...
def fork_driver() -> int: ...
def finalize(obj: Any, /) -> None: ...

#: ``finalize`` as an instance method: a class's ``__del__`` (calls ``self._finalize()``).
finalizer: Any
def set_stack_frames(frames: int, skip: str, /) -> int: ...
def graph_launch_direct(graph: Any, stream: object, /) -> bool: ...
def launch_direct(
    kernel: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared_mem: int, stream: object, args: Any, /
) -> bool: ...

# Code generated by bindings/door from the facade's declarations. DO NOT EDIT.
def copy_device(ordinal: int, dst: int, src: int, n: int, stream: int, /) -> int: ...
def copy_device_held(ordinal: int, dst: int, src: int, n: int, stream: int, /) -> int: ...
def copy_peer(stream_ordinal: int, dst_ordinal: int, dst: int, src_ordinal: int, src: int, n: int, stream: int, /) -> int: ...
def copy_peer_held(stream_ordinal: int, dst_ordinal: int, dst: int, src_ordinal: int, src: int, n: int, stream: int, /) -> int: ...
def copy_to_device(ordinal: int, dst: int, host: _BufferLike, n: int, stream: int, /) -> int: ...
def copy_to_device_held(ordinal: int, dst: int, host: _BufferLike, n: int, stream: int, /) -> int: ...
def copy_to_host(ordinal: int, host: _BufferLike, src: int, n: int, stream: int, /) -> int: ...
def copy_to_host_held(ordinal: int, host: _BufferLike, src: int, n: int, stream: int, /) -> int: ...
def event_query(handle: int, /) -> bool: ...
def event_record(handle: int, ordinal: int, stream_handle: int, /) -> int: ...
def event_wait(handle: int, timeout_ms: int, /) -> bool: ...
def function_launch(handle: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared_mem: int, stream: int, args: _BufferLike, /) -> int: ...
def graph_launch(id: int, ordinal: int, stream_handle: int, /) -> int: ...
def graph_upload(id: int, ordinal: int, stream_handle: int, /) -> int: ...
def noop(x: int, /) -> int: ...
def sim_direct_copy_to_device(ordinal: int, dst: int, host: _BufferLike, stream_handle: int, /) -> int: ...
def sim_direct_copy_to_host(ordinal: int, host: _BufferLike, src: int, stream_handle: int, /) -> int: ...
def sim_direct_event_query(ordinal: int, event_handle: int, /) -> int: ...
def sim_direct_graph_launch(ordinal: int, exec: int, stream_handle: int, /) -> int: ...
def sim_direct_stream_query(ordinal: int, stream_handle: int, /) -> int: ...
def stream_query(ordinal: int, handle: int, /) -> bool: ...
def stream_synchronize(ordinal: int, handle: int, /) -> bool: ...
def stream_wait(ordinal: int, handle: int, timeout_ms: int, /) -> bool: ...
def stream_wait_event(ordinal: int, handle: int, event: int, /) -> int: ...

"""The exception hierarchy, and the one funnel that every error from Go passes through.

Go errors reach Python as text in one format (see ``pkg/cuda/wire.go``)::

    cuda[<code> <NAME> <op>]{<key>=<value> ...}: <message>

gopy's cold door raises it as ``RuntimeError(text)``; the C doors (cudacore/native/door.c) pass the text
itself. Either way :func:`from_wire` is the one function that raises the typed exception (made by
:func:`typed_error`), with no chained ``RuntimeError``. The C
guard also builds its own errors here (:func:`forked_error`, :func:`closed_error`,
:func:`invalid_argument`), and Python code makes errors with :func:`error`, by result name: codes come
from the generated table of every result (``_results``), never from a literal. Both sides of the wire
test the same examples (``pkg/cuda/testdata/wire_examples.json``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, cast, get_args

from ._results import RESULTS

#: name -> code, from the generated table.
CODES: dict[str, int] = {row[0]: code for code, row in RESULTS.items()}

__all__ = [
    "CUDAError",
    "CaptureError",
    "DeviceFaultError",
    "DriverNotFoundError",
    "IllegalStateError",
    "InvalidHandleError",
    "InvalidImageError",
    "InvalidValueError",
    "LaunchError",
    "NotFoundError",
    "NotInitializedError",
    "NotReadyError",
    "NotSupportedError",
    "OutOfMemoryError",
    "closed_error",
    "decode",
    "error",
    "forked_error",
    "from_runtime_error",
    "from_wire",
    "invalid_argument",
    "typed_error",
]


class CUDAError(RuntimeError):
    """A failure of the CUDA driver or of a cudacore operation.

    Attributes
    ----------
    code : int
        The ``CUresult`` value (negative for cudacore's own codes, such as a missing driver).
    name : str
        The result's name, for example ``"CUDA_ERROR_OUT_OF_MEMORY"``.
    op : str
        The driver entry point or cudacore operation that failed, for example ``"cuMemAllocAsync"``.
    fields : dict[str, str]
        Structured details (numbers as decimal strings); subclasses expose the ones they know as
        attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        code: int = -4,
        name: str = "CUDACORE_ERROR_INTERNAL",
        op: str = "cudacore",
        fields: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.op = op
        self.fields = dict(fields or {})

    # BaseException pickles as cls(*args) plus __dict__, which restores the keyword attributes too.

    def _int_field(self, key: str) -> int | None:
        value = self.fields.get(key)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None


class DriverNotFoundError(CUDAError):
    """No usable CUDA driver: none installed, or ``CUDACORE_LIBCUDA`` names a file that is not one."""


class NotInitializedError(CUDAError):
    """The driver is not initialized or is shutting down."""


class NotSupportedError(CUDAError):
    """The device, driver or backend cannot do this (for example a pool on a TCC device)."""


class CaptureError(CUDAError):
    """An operation is illegal while a stream is capturing a graph, or the capture was invalidated."""


class InvalidValueError(CUDAError, ValueError):
    """An argument is out of range or of the wrong kind."""


class InvalidImageError(CUDAError, ValueError):
    """A kernel image (PTX, cubin or fatbin) is invalid or has no code for this device."""


class InvalidHandleError(CUDAError, ValueError):
    """A handle (stream, event, graph, buffer) is not valid: destroyed, closed or from elsewhere."""


class IllegalStateError(CUDAError):
    """The object is not in a state that allows this operation."""


class NotFoundError(CUDAError, LookupError):
    """A named symbol, such as a kernel function, was not found."""


class NotReadyError(CUDAError):
    """Asynchronous work has not completed yet."""


class LaunchError(CUDAError):
    """A kernel launch was refused, for example for lack of registers or shared memory."""


class DeviceFaultError(CUDAError):
    """The device faulted (illegal address, assert, ...); its context is unusable until the process ends."""


#: The verdicts of :attr:`OutOfMemoryError.cause` (docs/guide/diagnostics.md).
OutOfMemoryCause: TypeAlias = Literal[
    "exhausted", "other_processes", "fragmentation", "limit", "pool_reservation", "pool_max_size", "too_large", "injected"
]
OUT_OF_MEMORY_CAUSES: frozenset[str] = frozenset(get_args(OutOfMemoryCause))


class OutOfMemoryError(CUDAError, MemoryError):
    """An allocation failed for lack of memory, or would exceed a configured limit.

    The process and the device stay usable: nothing was allocated by the failed call.

    Attributes
    ----------
    requested : int
        Bytes asked for; 0 only when the driver ran out of memory in a call that asks for no size of its
        own (loading a module, creating a stream or graph): every allocation's failure sets it.
    free, total : int or None
        The device's free and total memory when the allocation failed.
    device : int or None
        The device ordinal.
    in_use, cached : int or None
        Bytes this process's pool had handed out, and held in reserve, at the time.
    limit : int or None
        The configured byte limit that was hit, if the failure is a limit's.
    cause : OutOfMemoryCause or None
        The verdict, which the message leads with: ``"exhausted"`` (this process holds the memory),
        ``"other_processes"``, ``"fragmentation"`` (enough free in total, not in one block),
        ``"limit"`` (a cudacore memory limit), ``"pool_reservation"`` (the driver refused the pool's
        reservation), ``"pool_max_size"`` (the shared pool of :func:`cudacore.share_pool` reached its
        ``max_size``) or ``"too_large"`` (more than the device has); on the simulator, ``"injected"`` when
        a fault injected for a test caused it. See docs/guide/diagnostics.md.
    flight_record : list of dict
        The allocator events that led here (see :func:`cudacore.flight_record`), oldest first, ending
        with this failure; empty when the recorder is off.
    by_library : dict of str to int
        While the device shares a pool (:func:`cudacore.share_pool`): the pool's use split by library
        when the error was made, or explained by :func:`cudacore.explain_oom`, as in
        ``memory_stats()["by_library"]``; the message ends with it. Empty otherwise.
    """

    flight_record: list[dict[str, Any]]
    by_library: dict[str, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flight_record = []
        self.by_library = {}

    @property
    def cause(self) -> OutOfMemoryCause | None:
        # Go's verdicts (pkg/memory/oom.go's Cause constants) are the Literal's values; a test checks so.
        return cast("OutOfMemoryCause | None", self.fields.get("cause"))

    @property
    def others(self) -> int | None:
        """Bytes held outside this process's allocator (other processes by NVML, else the gap)."""
        return self._int_field("others")

    @property
    def released(self) -> int | None:
        """Bytes of cached memory cudacore released and retried with before failing."""
        return self._int_field("released")

    @property
    def requested(self) -> int:
        return self._int_field("requested") or 0

    @property
    def free(self) -> int | None:
        return self._int_field("free")

    @property
    def total(self) -> int | None:
        return self._int_field("total")

    @property
    def device(self) -> int | None:
        return self._int_field("device")

    @property
    def in_use(self) -> int | None:
        return self._int_field("in_use")

    @property
    def cached(self) -> int | None:
        return self._int_field("cached")

    @property
    def pool_others(self) -> int | None:
        """Bytes the process's other libraries held in cudacore's pool (its use beyond cudacore's share)."""
        return self._int_field("pool_others")

    @property
    def limit(self) -> int | None:
        return self._int_field("limit")


# Users meet these as cudacore.<Name> (tracebacks, repr, pickles): the package exports each one, so the
# public module is where pickle finds them again.
for _cls in (
    CUDAError,
    DriverNotFoundError,
    NotInitializedError,
    NotSupportedError,
    CaptureError,
    InvalidValueError,
    InvalidImageError,
    InvalidHandleError,
    IllegalStateError,
    NotFoundError,
    NotReadyError,
    LaunchError,
    DeviceFaultError,
    OutOfMemoryError,
):
    _cls.__module__ = "cudacore"
del _cls

_BY_CATEGORY: dict[str, type[CUDAError]] = {
    "InvalidValue": InvalidValueError,
    "OutOfMemory": OutOfMemoryError,
    "NotInitialized": NotInitializedError,
    "DriverNotFound": DriverNotFoundError,
    "InvalidDevice": InvalidValueError,
    "InvalidImage": InvalidImageError,
    "InvalidHandle": InvalidHandleError,
    "IllegalState": IllegalStateError,
    "NotSupported": NotSupportedError,
    "NotFound": NotFoundError,
    "NotReady": NotReadyError,
    "Launch": LaunchError,
    "DeviceFault": DeviceFaultError,
    "Capture": CaptureError,
    "Unknown": CUDAError,
}

_WIRE = re.compile(
    r"cuda\[(?P<code>-?\d+) (?P<name>\S+) (?P<op>\S+)\](?:\{(?P<fields>[^{}]*)\})?: (?P<message>.*)\Z",
    re.DOTALL,
)
_FIELD_KEY = re.compile(r"[a-z0-9_]+\Z")


def category(code: int) -> str:
    """The category of a result code (``"OutOfMemory"``, ``"Capture"``, ...); ``"Unknown"`` if new."""
    row = RESULTS.get(code)
    return row[1] if row and row[1] != "-" else "Unknown"


def decode(text: str) -> dict[str, Any] | None:
    """Parse wire-format text into its parts, or return None if it is not in that format."""
    m = _WIRE.match(text)
    if m is None:
        return None
    fields: dict[str, str] = {}
    raw = m.group("fields")
    if raw:
        for pair in raw.split(" "):
            key, sep, value = pair.partition("=")
            if not sep or not _FIELD_KEY.match(key):
                return None
            fields[key] = value
    return {
        "code": int(m.group("code")),
        "name": m.group("name"),
        "op": m.group("op"),
        "fields": fields,
        "message": m.group("message"),
    }


def error(name: str, message: str, op: str = "cudacore", **fields: object) -> CUDAError:
    """The typed exception for result ``name`` (for example ``"CUDA_ERROR_INVALID_VALUE"``): its code and
    class come from the table of results. Field values are kept as text, as they arrive from Go."""
    code = CODES[name]
    cls = _BY_CATEGORY.get(category(code), CUDAError)
    exc = cls(message, code=code, name=name, op=op, fields={k: str(v) for k, v in fields.items()})
    if HOOKS:
        _run_hooks(exc)
    return exc


#: Called with every typed error :func:`typed_error` and :func:`error` make, where it is made (cudacore's
#: diagnostics attach the flight record to an OutOfMemoryError, and a capture rehearsal notes where each
#: CaptureError arose). A hook's own failure never replaces the error.
HOOKS: list[Callable[[CUDAError], None]] = []


def _run_hooks(exc: CUDAError) -> None:
    for hook in HOOKS:
        try:
            hook(exc)
        except Exception:  # noqa: BLE001, S110 - a diagnostic must never hide the error it describes
            pass


def typed_error(text: str) -> CUDAError | None:
    """The typed exception for wire-format text from Go, or None if the text is not in the format."""
    parts = decode(text)
    if parts is None:
        return None
    cls = _BY_CATEGORY.get(category(parts["code"]), CUDAError)
    exc = cls(parts["message"], code=parts["code"], name=parts["name"], op=parts["op"], fields=parts["fields"])
    if HOOKS:
        _run_hooks(exc)
    return exc


def from_wire(text: str) -> None:
    """The doors' funnel (the C guard calls it with a Go error's wire-format text): raise its typed exception.

    The exception is raised here, not returned, so that it reaches the caller alone: the C guard would
    otherwise chain gopy's ``RuntimeError`` (the same message in wire form) to it as ``__cause__``, and every
    traceback would show the message twice. The wire form's parts stay on the exception (``code``,
    ``name``, ``op``, ``fields``). Returns None, raising nothing, for text not in the format: the guard then
    raises the original as it is.
    """
    __tracebackhide__ = True  # pytest: this frame is the funnel's, not the caller's
    typed = typed_error(text)
    if typed is not None:
        try:
            raise typed from None
        finally:
            # This frame is in the exception's traceback: a local still naming the exception would make a
            # reference cycle, and every frame of the traceback, with the caller's Buffers, would live until
            # the garbage collector ran (an out-of-memory failure would keep the memory it failed for).
            del typed


def from_runtime_error(exc: BaseException) -> BaseException:
    """Return the typed exception for a gopy ``RuntimeError``; any other exception is returned unchanged.

    The caller raises the result ``from None``: the typed exception carries every part of the original's
    wire-format text, which would only repeat the message.
    """
    if not isinstance(exc, RuntimeError) or isinstance(exc, CUDAError):
        return exc
    typed = typed_error(str(exc))
    return exc if typed is None else typed


FORKED_MESSAGE = (
    "this process was forked from a parent that had loaded cudacore; CUDA and the Go runtime do not "
    "survive fork(). Start worker processes with the spawn method: "
    "multiprocessing.set_start_method('spawn') or multiprocessing.get_context('spawn'), or "
    "concurrent.futures.ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))."
)


#: What the parent's CUDA driver was when it forked (``_fast.fork_driver()``), in the child's error.
FORK_DRIVER_NOTES = {
    1: " The CUDA driver library was loaded in the parent, but not initialised, when it forked.",
    2: (
        " The CUDA driver was already initialised in the parent when it forked (cuInit had been called, by "
        "cudacore or by another library in the process such as PyTorch, CuPy or Numba): no library can use "
        "CUDA in this child."
    ),
}


def forked_error(op: str, driver: int = 0) -> CUDAError:
    """The error every door raises in a forked child, before Go is entered. ``driver`` is what the parent's
    CUDA driver was at the fork (0 not loaded, 1 loaded, 2 initialised by any library); the message says so."""
    note = FORK_DRIVER_NOTES.get(driver, "")
    return error("CUDACORE_ERROR_FORKED", f"{op}: {FORKED_MESSAGE}{note}", op="fork", driver_at_fork=driver)


def closed_error(what: str, op: str) -> CUDAError:
    """The error for using a closed object: one code (CUDACORE_ERROR_CLOSED) whatever the object."""
    return error(
        "CUDACORE_ERROR_CLOSED", f"this {what} is closed: its resources were released, so it can no longer be used", op=op
    )


def invalid_argument(fn: str, arg: str, detail: str, value: object) -> CUDAError:
    """The error for an argument that cannot cross into Go, naming the function and the argument."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return error("CUDA_ERROR_INVALID_VALUE", f"{fn}: {arg} {detail}, got {shown}", op=f"cudacore.{fn}", argument=arg)

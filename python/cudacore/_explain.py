"""cudacore's verdict for an out-of-memory error of any library of the process: :func:`explain_oom`.

With a shared pool (:func:`cudacore.share_pool`), PyTorch, CuPy and RMM allocate from the pool natively,
and their out-of-memory errors are their own: no cudacore code runs when they fail (PyTorch's
out-of-memory observer, the one hook a library offers, is refused by its ``cudaMallocAsync`` backend).
:func:`explain_oom`, called in the ``except`` block, reads what the error says (the library, the size it
asked for, the device, PyTorch's own count of its bytes) and asks Go for the verdict cudacore gives its own
failures (``process.Device.ExplainOutOfMemory``), from the device's state at that moment.

While a device shares a pool, every :class:`OutOfMemoryError` made for it, cudacore's own and the
explained ones, carries the split of the pool's use by library (``by_library``, and a sentence at the end
of its message): the hook below adds it where the error is made.
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from . import _accounts, _broker, _errors
from ._api import core
from ._device import Device
from ._display import format_bytes
from ._errors import OutOfMemoryError, error
from ._handles import as_device

__all__ = ["explain_oom"]

_OP = "cudacore.explain_oom"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# Numbers are read with at most 19 digits (2**63 has 19): a longer one is no size or ordinal an allocation
# has, and is not read at all (Python refuses to convert thousands of digits to an int, and past 308 a
# float is infinite), so that the error is taken as saying nothing of it.
_SIZE = r"(\d{1,19}(?:\.\d{1,19})?) (bytes|KiB|MiB|GiB)"
# PyTorch's messages (c10/cuda): the cudaMallocAsync backend's, and the native allocator's.
_TORCH_REQUESTED = (re.compile(r"Requested\s*:\s*" + _SIZE), re.compile(r"Tried to allocate " + _SIZE))
_TORCH_CURRENT = re.compile(r"Currently allocated\s*:\s*" + _SIZE)
_TORCH_DEVICE = (re.compile(r"Allocation on device (\d{1,19})\b"), re.compile(r"GPU (\d{1,19}) has a total capacity"))
# CuPy's OutOfMemoryError: "Out of memory allocating 1,024 bytes (allocated so far: ...)".
_CUPY_REQUESTED = re.compile(r"allocating (\d[\d,]{0,25}) bytes")  # a digit first: never int("")
# RMM's rmm::out_of_memory, which Python sees as a MemoryError: "std::bad_alloc: out_of_memory: CUDA error
# (failed to allocate 1024 bytes) at: ...".
_RMM_MARK = "out_of_memory"
_RMM_REQUESTED = re.compile(r"failed to allocate (\d{1,19}) bytes")
_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, the runtime's out-of-memory result

# Rows of the split that the error being explained carries (PyTorch's own count), for the hook.
_known: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("cudacore_oom_known", default=None)


@dataclass
class _Failure:
    """What an out-of-memory error of a library says about itself."""

    op: str  # the library ("torch", "cupy", "rmm"), or a cudacore error's entry point
    requested: int | None = None  # the bytes it asked for, when the error says
    device: int | None = None
    stream: int = 0  # the library's current stream (a CUstream), 0 when unknown
    known: dict[str, int] = field(default_factory=dict)  # rows of the split the error gives
    verdict: OutOfMemoryError | None = None  # a cudacore error that has its verdict already


def _torch_bytes(m: re.Match[str]) -> int:
    """A size as PyTorch writes it (c10's format_size: two decimals of its unit) in bytes."""
    return round(float(m.group(1)) * _UNITS[m.group(2)])


def _text(exc: BaseException) -> str:
    """``str(exc)``, or "" where the error's ``__str__`` raises (the error is the caller's object: what it
    cannot say is read as saying nothing). A KeyboardInterrupt or a MemoryError is raised, never lost."""
    try:
        return str(exc)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return ""


def _attribute(exc: BaseException, name: str) -> object:
    """``exc``'s attribute ``name``, or None where it is missing or raises when read (as :func:`_text`)."""
    try:
        return getattr(exc, name, None)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return None


def _linked(e: BaseException) -> list[BaseException]:
    """``e.__cause__`` and ``e.__context__``, those that are exceptions: a subclass may make them properties
    that raise or answer anything, which are read as no link."""
    links = (_attribute(e, "__cause__"), _attribute(e, "__context__"))
    return [link for link in links if isinstance(link, BaseException)]


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    for p in patterns:
        m = p.search(text)
        if m is not None:
            return m
    return None


def _torch_failure(exc: BaseException) -> _Failure | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    cuda: Any = getattr(torch, "cuda", None)
    classes = tuple(c for c in (getattr(torch, "OutOfMemoryError", None), getattr(cuda, "OutOfMemoryError", None)) if isinstance(c, type))
    if not classes or not isinstance(exc, classes):
        return None
    text = _text(exc)
    f = _Failure("torch")
    m = _first(_TORCH_REQUESTED, text)
    if m is not None:
        f.requested = _torch_bytes(m)
    m = _first(_TORCH_DEVICE, text)
    if m is not None:
        f.device = int(m.group(1))
    # The cudaMallocAsync backend's message gives PyTorch's own count of its bytes on the device; one no
    # device can hold is left out of the split.
    m = _TORCH_CURRENT.search(text)
    current = _torch_bytes(m) if m is not None else None
    if current is not None and current < 1 << 63:
        f.known["torch"] = current
    try:
        stream = cuda.current_stream(f.device) if f.device is not None else cuda.current_stream()
        f.stream = int(stream.cuda_stream)
    except Exception:  # noqa: BLE001 - no stream known: the verdict takes the legacy stream's view
        f.stream = 0
    return f


def _cupy_failure(exc: BaseException) -> _Failure | None:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    memory: Any = getattr(getattr(cupy, "cuda", None), "memory", None)
    runtime: Any = getattr(getattr(cupy, "cuda", None), "runtime", None)
    oom = getattr(memory, "OutOfMemoryError", None)
    runtime_error = getattr(runtime, "CUDARuntimeError", None)
    if isinstance(oom, type) and isinstance(exc, oom):
        f = _Failure("cupy")
        size = _attribute(exc, "_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            f.requested = size
        else:
            m = _CUPY_REQUESTED.search(_text(exc))
            if m is not None:
                f.requested = int(m.group(1).replace(",", ""))
    elif isinstance(runtime_error, type) and isinstance(exc, runtime_error) and _attribute(exc, "status") == _CUDA_ERROR_MEMORY_ALLOCATION:
        f = _Failure("cupy")  # a runtime call of CuPy's: the size is not in the error
    else:
        return None
    try:
        f.device = int(runtime.getDevice())
        f.stream = int(cupy.cuda.get_current_stream().ptr)
    except Exception:  # noqa: BLE001, S110 - the current device and the legacy stream stand in
        pass
    return f


def _rmm_failure(exc: BaseException) -> _Failure | None:
    text = _text(exc) if isinstance(exc, MemoryError) else ""
    if _RMM_MARK not in text:
        return None
    f = _Failure("rmm")
    m = _RMM_REQUESTED.search(text)
    if m is not None:
        f.requested = int(m.group(1))
    return f


def _cudacore_failure(exc: BaseException) -> _Failure | None:
    if not isinstance(exc, OutOfMemoryError):
        return None
    if exc.cause is not None:
        return _Failure(exc.op, verdict=exc)
    # A driver refusal that reached Python without a verdict (an entry point, not the allocator).
    return _Failure(exc.op, requested=exc.requested or None, device=exc.device)


_RECOGNIZERS = (_cudacore_failure, _torch_failure, _cupy_failure, _rmm_failure)


def _recognize(exc: BaseException) -> _Failure | None:
    """The out-of-memory failure ``exc`` is, or its cause or context is (a library's error re-raised)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        for recognize in _RECOGNIZERS:
            f = recognize(e)
            if f is not None:
                return f
        todo += _linked(e)
    return None


def explain_oom(exc: BaseException, device: Device | int | None = None, *, requested: int | None = None) -> OutOfMemoryError:
    """cudacore's :class:`OutOfMemoryError` for an out-of-memory error of PyTorch, CuPy, RMM or cudacore.

    Call it in the ``except`` block, at once (the verdict reads the device as it is then)::

        try:
            x = torch.empty(n, device="cuda")
        except torch.OutOfMemoryError as e:
            raise cc.explain_oom(e) from e

    The result has cudacore's verdict (``cause``, and the message that leads with it) for an allocation
    of that size on that device, and, while the device shares a pool (:func:`share_pool`), the split of
    the pool's use by library (``by_library``), where PyTorch's row is the count its own message gives.
    Its ``op`` names the library whose allocation failed (``"torch"``, ``"cupy"``, ``"rmm"``). A cudacore
    error that has its verdict already is returned as it is.

    Parameters
    ----------
    exc : BaseException
        The error caught: ``torch.OutOfMemoryError``, ``cupy.cuda.memory.OutOfMemoryError`` (or CuPy's
        ``CUDARuntimeError`` of ``cudaErrorMemoryAllocation``), RMM's ``MemoryError`` (its
        ``out_of_memory``), a cudacore :class:`OutOfMemoryError`, or an error raised from one of those.
    device : Device or int, optional
        The device the allocation was for; None: the one the error names, else the current device.
    requested : int, optional
        The bytes the allocation asked for; None: the size the error gives.

    Returns
    -------
    OutOfMemoryError
        cudacore's error, to raise (``raise cc.explain_oom(e) from e``) or to read.

    Raises
    ------
    TypeError
        If ``exc`` is not an out-of-memory error of one of those libraries, or ``requested`` is not an int.
    InvalidValueError
        If ``requested`` is not positive, or the error does not say its size and ``requested`` is None.
    """
    if not isinstance(exc, BaseException):
        raise TypeError(f"explain_oom takes the exception caught, not {type(exc).__name__}")
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int)):
        raise TypeError(f"requested must be an int number of bytes or None, not {type(requested).__name__}")
    failure = _recognize(exc)
    if failure is None:
        shown = _text(exc)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise TypeError(
            f"explain_oom takes an out-of-memory error of cudacore, PyTorch, CuPy or RMM; "
            f"{type(exc).__module__}.{type(exc).__qualname__} is none of them: {shown!r}"
        )
    if failure.verdict is not None and requested is None and device is None:
        return failure.verdict
    size = requested if requested is not None else failure.requested
    if size is None:
        raise error("CUDA_ERROR_INVALID_VALUE", f"explain_oom: this out-of-memory error of {failure.op} does not say how many bytes "
                    "it asked for: pass requested=<bytes>", op=_OP)
    if size <= 0 or size >= 1 << 63:
        if requested is None:
            raise error("CUDA_ERROR_INVALID_VALUE", f"explain_oom: this out-of-memory error of {failure.op} asks for {size} bytes, "
                        "which no allocation can (1 to 2**63 - 1): pass requested=<bytes>", op=_OP)
        raise error("CUDA_ERROR_INVALID_VALUE", f"explain_oom: requested must be positive and below 2**63, got {size}", op=_OP)
    dev = as_device(device if device is not None else failure.device)
    text = core.ExplainOOM(dev.device_id, size, failure.stream, failure.op)
    token = _known.set(failure.known)
    try:
        explained = _errors.typed_error(text)
    finally:
        _known.reset(token)
    assert isinstance(explained, OutOfMemoryError), text
    return explained


def _split_sentence(used: int, rows: dict[str, int]) -> str:
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in rows.items())
    return f"By library, the shared pool's {format_bytes(used)} in use: {parts}."


_splitting: contextvars.ContextVar[bool] = contextvars.ContextVar("cudacore_oom_splitting", default=False)


def _attach_split(exc: _errors.CUDAError) -> None:
    """The OutOfMemoryError hook: while the error's device shares a pool, its split by library. An error
    raised while the split is read (the driver's, by the statistics' query) gets none."""
    if not isinstance(exc, OutOfMemoryError) or exc.op == "fork" or _splitting.get():
        return
    ordinal = exc.device
    if ordinal is None or _broker.shared_pool_of(ordinal) is None:
        return
    token = _splitting.set(True)
    try:
        counters: dict[str, Any] = json.loads(core.MemoryStats(ordinal))
        used = int(counters["pool_used"])
        rows = _accounts.split(ordinal, used, counters["by_library"], _known.get())
    finally:
        _splitting.reset(token)
    exc.by_library = rows
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} {_split_sentence(used, rows)}", *exc.args[1:])


# Before the flight recorder's hook, which writes the message to its file.
_errors.HOOKS.insert(0, _attach_split)

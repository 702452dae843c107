"""One pool for every library of the process: :func:`share_pool`.

cudacore makes a device's memory pool the device's *current* pool (``cuDeviceSetMemPool``), moves its own
allocator into it, and wires each installed library to it natively, with nothing of Python on their
allocation paths:

- PyTorch through its ``cudaMallocAsync`` backend, which allocates from the current pool (chosen when
  ``torch`` is imported: ``PYTORCH_CUDA_ALLOC_CONF`` is set here if torch is not imported yet);
- CuPy through ``cupy.cuda.MemoryAsyncPool`` on the pool, made CuPy's allocator (PyTorch and CuPy publish
  no count of their bytes: each is declared a library without one, whose row is the pool's remainder
  while it is the only such library drawing from the pool, cudacore._accounts);
- RMM through ``rmm.mr.CudaAsyncViewMemoryResource`` on the pool, under a ``StatisticsResourceAdaptor``
  (its bytes are its row of the split), made the device's RMM resource;
- Numba through cudacore's memory-manager plug-in (``cudacore.interop.NumbaMemoryManager``), which
  allocates from cudacore's allocator, now in the pool;
- JAX is not wired: XLA's ``cuda_async`` allocator takes the device's *default* pool, not its current
  one (docs/guide/one-pool.md).

The design is in docs/contributing/design.md ("One pool for the process"); the pool itself is Go's
(cudacore/internal/process/sharedpool.go). The objects that wire a library (CuPy's pool object, RMM's
resources, the previous allocators to put back) are Python objects, kept by the :class:`SharedPool`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from . import _accounts, interop
from ._api import core
from ._device import Device
from ._display import format_bytes
from ._errors import CUDAError, error
from ._handles import as_device

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["LIBRARIES", "SharedPool", "Wiring", "share_pool", "shared_pool", "shared_pool_of"]

#: The libraries :func:`share_pool` knows how to wire, in the order it wires them.
LIBRARIES = ("torch", "cupy", "rmm", "numba", "jax")

_OP = "cudacore.share_pool"
_lock = threading.RLock()
_active: dict[int, SharedPool] = {}  # ordinal -> the device's live SharedPool


@dataclass(frozen=True)
class Wiring:
    """What :func:`share_pool` did to one library.

    Attributes
    ----------
    library : str
        The library's import name (``"torch"``, ``"cupy"``, ``"rmm"``, ``"numba"``, ``"jax"``).
    wired : bool
        Whether the library now allocates from the shared pool (or will, once imported).
    how : str
        What was done, or why nothing could be.
    """

    library: str
    wired: bool
    how: str


class _Wired:
    """A wiring with what undoes it (None: nothing to undo)."""

    __slots__ = ("undo", "wiring")

    def __init__(self, wiring: Wiring, undo: Callable[[], None] | None = None) -> None:
        self.wiring = wiring
        self.undo = undo


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# -- each library ------------------------------------------------------------------------------------------

_TORCH_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _torch_backend_asked() -> str | None:
    """The ``backend:`` option of PyTorch's allocator configuration in the environment, if any."""
    for var in _TORCH_CONF:
        for option in os.environ.get(var, "").replace(" ", ",").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "backend" and value.strip():
                return value.strip()
    return None


def _torch_draws() -> bool:
    """Whether PyTorch allocates from the device's current pool now: imported, with its cudaMallocAsync
    backend (its ``cudaMallocAsync`` calls take the current pool)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.get_allocator_backend() == "cudaMallocAsync"


def _uncounted(pool: SharedPool, name: str, drawing: Callable[[], bool], undo: Callable[[], None] | None = None) -> Callable[[], None]:
    """Make ``name`` an uncounted library of the pool's split (cudacore._accounts); the undo returned
    removes it, then runs ``undo``."""
    ordinal = pool.device.device_id
    _accounts.report_uncounted(ordinal, name, drawing)

    def undo_all() -> None:
        _accounts.report_uncounted(ordinal, name, None)
        if undo is not None:
            undo()

    return undo_all


def _wire_torch(pool: SharedPool) -> _Wired:
    if "torch" not in sys.modules:
        asked = _torch_backend_asked()
        if asked is not None and asked != "cudaMallocAsync":
            return _Wired(Wiring("torch", False, (
                f"the environment asks PyTorch for its {asked!r} allocator backend "
                f"({'/'.join(_TORCH_CONF)}): ask for backend:cudaMallocAsync instead, which allocates from the device's current pool")))
        if asked is None:
            var = _TORCH_CONF[0]
            before = os.environ.get(var)
            os.environ[var] = f"{before},backend:cudaMallocAsync" if before else "backend:cudaMallocAsync"

            def undo() -> None:
                if "torch" not in sys.modules:  # once imported, PyTorch's backend is set for the process
                    _set_env(var, before)

            return _Wired(Wiring("torch", True, (
                f"{var} now asks for backend:cudaMallocAsync: PyTorch, imported after this, allocates with "
                "cudaMallocAsync from the device's current pool")), _uncounted(pool, "torch", _torch_draws, undo))
        return _Wired(Wiring("torch", True, (
            "the environment asks for backend:cudaMallocAsync: PyTorch, imported after this, allocates "
            "from the device's current pool")), _uncounted(pool, "torch", _torch_draws))
    torch = sys.modules["torch"]
    backend = torch.cuda.get_allocator_backend()
    if backend == "cudaMallocAsync":
        return _Wired(Wiring("torch", True, "PyTorch's cudaMallocAsync backend allocates from the device's current pool"),
                      _uncounted(pool, "torch", _torch_draws))
    return _Wired(Wiring("torch", False, (
        f"PyTorch was imported with its {backend!r} allocator backend, which it chooses once, when torch is "
        "imported: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, or call cudacore.share_pool(), before "
        "importing torch")))


def _wire_cupy(pool: SharedPool) -> _Wired:
    import cupy

    ordinal = pool.device.device_id
    count = cupy.cuda.runtime.getDeviceCount()
    # CuPy makes each device's handle current (cudaDeviceSetMemPool): its own current pool for the others.
    handles: list[Any] = ["current"] * count
    handles[ordinal] = pool.handle
    async_pool = cupy.cuda.MemoryAsyncPool(pool_handles=handles)
    malloc = async_pool.malloc
    before = cupy.cuda.memory.get_allocator()
    cupy.cuda.set_allocator(malloc)
    pool._keep.append(async_pool)

    def cupy_draws() -> bool:  # CuPy allocates from the pool while the allocator set here is its allocator
        return bool(cupy.cuda.memory.get_allocator() == malloc)

    def set_back() -> None:
        cupy.cuda.set_allocator(before)

    undo = _uncounted(pool, "cupy", cupy_draws, set_back)

    how = "cupy.cuda.MemoryAsyncPool on the shared pool is CuPy's allocator (cudaMallocAsync on CuPy's current stream)"
    if pool.release_threshold is not None:
        how += (
            f"; CuPy reads the pool's release threshold ({format_bytes(pool.release_threshold)}) as its limit "
            "and refuses to grow the pool beyond it"
        )
    return _Wired(Wiring("cupy", True, how), undo)


def _pool_handle_object(handle: int) -> Any:
    """The pool as the ``CUmemoryPool`` of cuda-python that RMM takes."""
    try:
        from cuda.bindings import driver
    except ImportError:  # cuda-python before 12.6
        from cuda import cuda as driver  # type: ignore[no-redef, attr-defined]
    return driver.CUmemoryPool(handle)


def _rmm_bytes(stats: Any) -> int:
    counts = stats.allocation_counts
    value = counts["current_bytes"] if isinstance(counts, dict) else counts.current_bytes
    return int(value)


def _wire_rmm(pool: SharedPool) -> _Wired:
    import rmm

    ordinal = pool.device.device_id
    view = rmm.mr.CudaAsyncViewMemoryResource(_pool_handle_object(pool.handle))
    stats = rmm.mr.StatisticsResourceAdaptor(view)
    before = rmm.mr.get_per_device_resource(ordinal)
    rmm.mr.set_per_device_resource(ordinal, stats)
    _accounts.report_outside(ordinal, "rmm", lambda: _rmm_bytes(stats))

    def undo() -> None:
        _accounts.report_outside(ordinal, "rmm", None)
        rmm.mr.set_per_device_resource(ordinal, before)

    return _Wired(Wiring("rmm", True, (
        "rmm.mr.CudaAsyncViewMemoryResource on the shared pool, under a StatisticsResourceAdaptor, is the "
        f"device's RMM resource (device {ordinal})")), undo)


_NUMBA_ENV = "NUMBA_CUDA_MEMORY_MANAGER"


def _wire_numba(pool: SharedPool) -> _Wired:
    if "numba" not in sys.modules:
        before = os.environ.get(_NUMBA_ENV)
        if before not in (None, "", "cudacore.interop"):
            return _Wired(Wiring("numba", False, (
                f"{_NUMBA_ENV}={before} names another memory manager: set it to cudacore.interop")))
        os.environ[_NUMBA_ENV] = "cudacore.interop"

        def undo_env() -> None:
            if "numba" not in sys.modules:
                _set_env(_NUMBA_ENV, before)

        return _Wired(Wiring("numba", True, (
            f"{_NUMBA_ENV}=cudacore.interop: Numba, imported after this, allocates through cudacore's plug-in, "
            "from the shared pool")), undo_env)
    from numba import cuda
    from numba.cuda.cudadrv import driver as nbdriver

    started = bool(getattr(nbdriver.driver, "is_initialized", True))
    before_manager = getattr(nbdriver, "_memory_manager", None)
    cuda.set_memory_manager(interop.NumbaMemoryManager)

    def undo() -> None:
        if before_manager is not None:
            cuda.set_memory_manager(before_manager)
        else:
            nbdriver._memory_manager = None

    how = "cudacore's plug-in (cudacore.interop.NumbaMemoryManager), allocating from the shared pool, is Numba's memory manager"
    if started:
        how += "; a context Numba made before this keeps its own until numba.cuda.close()"
    return _Wired(Wiring("numba", True, how), undo)


def _wire_jax(pool: SharedPool) -> _Wired:
    if pool.owned:
        return _Wired(Wiring("jax", False, (
            "XLA's cuda_async allocator takes the device's default pool, not its current one: "
            "share_pool(pool=\"default\") shares that pool (without max_size or ipc)")))
    return _Wired(Wiring("jax", False, (
        "not wired by cudacore: with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async (and XLA_PYTHON_CLIENT_PREALLOCATE=false) "
        "XLA allocates from this pool, the device's default pool, and sets its release threshold itself")))


_WIRE: dict[str, Callable[[SharedPool], _Wired]] = {
    "torch": _wire_torch,
    "cupy": _wire_cupy,
    "rmm": _wire_rmm,
    "numba": _wire_numba,
    "jax": _wire_jax,
}


def _wire(name: str, pool: SharedPool) -> _Wired:
    """Wire library ``name`` to ``pool``. A library that is not installed, or whose wiring fails, is
    reported so (and warned of), not raised: the pool and the other libraries stay shared."""
    if not _installed(name):
        return _Wired(Wiring(name, False, "not installed"))
    try:
        return _WIRE[name](pool)
    except Exception as e:  # noqa: BLE001 - reported in its Wiring (and warned of); the rest goes on
        warnings.warn(f"cudacore.share_pool could not wire {name}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
        return _Wired(Wiring(name, False, f"wiring failed: {type(e).__name__}: {e}"))


# -- the pool ----------------------------------------------------------------------------------------------


class SharedPool:
    """A device's memory pool shared by every library of the process (see :func:`share_pool`).

    It is the device's current pool (the one ``cudaMallocAsync`` allocates from), cudacore's allocator
    draws from it, and the libraries of :attr:`libraries` were wired to it. :meth:`undo` (or the end of a
    ``with`` block) puts everything back. Its use and reserve over every library, and their split, are in
    ``Device.memory_stats()`` (``pool_used``, ``reserved``, ``by_library``).

    Attributes
    ----------
    device : Device
        The device.
    handle : int
        The pool's driver handle (a ``CUmemoryPool``), for libraries cudacore does not wire.
    previous_pool : int
        The device's current pool before this one: :meth:`undo` makes it current again.
    owned : bool
        True for a pool cudacore created (destroyed by :meth:`undo`); False for the device's default pool.
    max_size : int or None
        The most the pool reserves (a pool of cudacore's own only); None: no cap.
    ipc : bool
        Whether other processes can import the pool (POSIX file descriptor handles).
    """

    def __init__(self, device: Device, info: dict[str, Any], release_threshold: int | None) -> None:
        self.device = device
        self.handle: int = info["handle"]
        self.previous_pool: int = info["previous"]
        self.owned: bool = info["owned"]
        self.max_size: int | None = info["max_size"] or None
        self.ipc: bool = info["ipc"]
        self._threshold = release_threshold
        self._wired: dict[str, _Wired] = {}
        self._keep: list[Any] = []  # the libraries' objects the wiring needs alive (CuPy's pool object)
        self._tracked: list[str] = []
        self._closed = False

    @property
    def release_threshold(self) -> int | None:
        """What the pool keeps reserved across a synchronize, in bytes; None: everything."""
        return self._threshold

    @property
    def libraries(self) -> dict[str, Wiring]:
        """What :func:`share_pool` did to each library it was asked to wire, by name."""
        return {name: w.wiring for name, w in self._wired.items()}

    @property
    def wired(self) -> tuple[str, ...]:
        """The libraries that allocate from the pool (or will once imported)."""
        return tuple(name for name, w in self._wired.items() if w.wiring.wired)

    @property
    def closed(self) -> bool:
        """Whether :meth:`undo` ran."""
        return self._closed

    def track(self, name: str, bytes_in_use: Callable[[], int] | None = None) -> None:
        """Give another library's use of the pool a row of its own in ``memory_stats()["by_library"]``.

        With ``bytes_in_use``, it is called at each ``memory_stats()`` and answers what ``name`` holds in
        the pool now: its bytes leave ``"unattributed"``. Without it, ``name`` allocates from the pool and
        keeps no count of its own (as PyTorch's and CuPy's allocators, which :func:`share_pool` declares
        so): while it is the only such library drawing from the pool, the pool's use less every count is
        its row, ``"<name> (by difference)"``; with two or more, their bytes stay ``"unattributed"``. A
        count supersedes: a library tracked with one is never taken by difference. :meth:`undo` removes
        the row.

        Raises
        ------
        IllegalStateError
            If the pool was undone.
        InvalidValueError
            If ``name`` is empty, one of the split's own rows (``"cudacore"``, ``"unattributed"``), ends
            with ``" (by difference)"``, or names a library already reporting on this device (with a
            count; without one, also a library already declared without a count).
        TypeError
            If ``bytes_in_use`` is given and not callable.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if bytes_in_use is not None and not callable(bytes_in_use):
            raise TypeError(f"bytes_in_use must be callable or None, not {type(bytes_in_use).__name__}")
        if self._closed:
            raise error("CUDA_ERROR_ILLEGAL_STATE", "this SharedPool was undone: share a pool again to track a library in it",
                        op="cudacore.SharedPool.track")
        ordinal = self.device.device_id
        taken = set(_accounts.reporters(ordinal))
        if bytes_in_use is None:
            taken.update(_accounts.uncounted(ordinal))
        if not name or name in _accounts.RESERVED_NAMES or name.endswith(_accounts.BY_DIFFERENCE) or name in taken:
            raise error("CUDA_ERROR_INVALID_VALUE", f"{name!r} cannot name a row of device {ordinal}'s split: it is empty, "
                        "the split's own, or a library reporting already", op="cudacore.SharedPool.track")
        if bytes_in_use is None:
            _accounts.report_uncounted(ordinal, name, lambda: True)
        else:
            _accounts.report_outside(ordinal, name, bytes_in_use)
        self._tracked.append(name)

    def undo(self) -> None:
        """Put back what :func:`share_pool` did: each library's previous allocator (PyTorch cannot be
        unwired once imported: it then allocates from the device's current pool, the previous one again),
        cudacore's allocator in the default pool, the previous current pool, and a pool of cudacore's own
        destroyed (the driver frees it once the blocks other libraries still hold in it are freed).
        Idempotent.

        Raises
        ------
        IllegalStateError
            While cudacore's allocator has memory in a pool of cudacore's own (close those buffers first);
            nothing changes.
        CaptureError
            While a stream captures; nothing changes.
        CUDAError
            When the driver refused a step after cudacore's allocator had left the pool (making the
            previous pool current, destroying the pool): the pool is no longer shared, the object is
            closed, and the error names the step.
        """
        with _lock:
            if self._closed:
                return
            ordinal = self.device.device_id
            undone = list(self._wired)
            for name in reversed(undone):
                w = self._wired[name]
                if w.undo is not None:
                    w.undo()
            try:
                core.PoolUnshare(ordinal)
            except CUDAError:
                if json.loads(core.PoolInfo(ordinal))["shared"] is not None:
                    for name in undone:  # nothing changed: the libraries go back to the pool
                        self._wired[name] = _wire(name, self)
                    raise
                # The pool is unshared, but a later step failed (the previous current pool or the
                # pool's destruction): this object is done with, and the error says what failed.
                self._forget()
                raise
            self._forget()

    def _forget(self) -> None:
        ordinal = self.device.device_id
        for name in self._tracked:
            _accounts.report_outside(ordinal, name, None)
            _accounts.report_uncounted(ordinal, name, None)
        self._closed = True
        if _active.get(ordinal) is self:
            del _active[ordinal]

    close = undo

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "undone" if self._closed else ("wired: " + (", ".join(self.wired) or "none"))
        kind = "cudacore's own" if self.owned else "the default pool"
        return f"<cudacore.SharedPool device {self.device.device_id}, {kind} {self.handle:#x}, {state}>"


def _bytes_arg(name: str, value: object, *, zero: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes or None, not {type(value).__name__}")
    if value < 0 or (value == 0 and not zero) or value >= 1 << 63:
        what = "0 or more" if zero else "positive (None for no cap)"
        raise error("CUDA_ERROR_INVALID_VALUE", f"{name} must be {what} and below 2**63, got {value}", op=_OP)
    return value


def _libraries_arg(libraries: Iterable[str] | None) -> tuple[str, ...]:
    if libraries is None:
        return LIBRARIES
    if isinstance(libraries, str):
        raise TypeError(f"libraries must be a list of names, such as [{libraries!r}], not a str")
    chosen = tuple(libraries)
    for name in chosen:
        if name not in LIBRARIES:
            raise error("CUDA_ERROR_INVALID_VALUE", f"cannot wire {name!r}: cudacore wires {', '.join(LIBRARIES)}", op=_OP)
    return tuple(name for name in LIBRARIES if name in chosen)


def share_pool(
    device: Device | int | None = None,
    *,
    release_threshold: int | None = None,
    max_size: int | None = None,
    ipc: bool = False,
    pool: Literal["own", "default"] = "own",
    libraries: Iterable[str] | None = None,
) -> SharedPool:
    """Make one memory pool serve every library of the process on ``device``, natively.

    cudacore creates a pool (or, with ``pool="default"``, takes the device's default pool), sets its
    attributes, moves its own allocator into it, makes it the device's current pool, and wires each
    library of ``libraries``: PyTorch (its ``cudaMallocAsync`` backend), CuPy (``MemoryAsyncPool``), RMM
    (``CudaAsyncViewMemoryResource``) and Numba (cudacore's plug-in) allocate from it with no Python on
    their allocation paths. JAX is reported, not wired (XLA's allocator takes the default pool). Calling
    it again with the same ``pool``, ``max_size`` and ``ipc`` changes the release threshold and wires
    libraries not wired yet. See docs/guide/one-pool.md.

    Parameters
    ----------
    device : Device or int, optional
        The device (None: the current device).
    release_threshold : int, optional
        Bytes the pool keeps reserved across a synchronize; None keeps everything (cudacore's default).
    max_size : int, optional
        The most the pool may reserve (a pool of cudacore's own; needs a CUDA 12.2 driver); None: no cap.
    ipc : bool
        Make the pool importable by other processes (POSIX file descriptor handles; a pool of cudacore's own).
    pool : {"own", "default"}
        ``"own"``: a pool cudacore creates (and destroys on :meth:`SharedPool.undo`); ``"default"``: the
        device's default pool, whose properties the driver fixed (no ``max_size``, no ``ipc``).
    libraries : list of str, optional
        Which of ``"torch"``, ``"cupy"``, ``"rmm"``, ``"numba"``, ``"jax"`` to wire; None: all of them (one
        that is not installed is reported so in :attr:`SharedPool.libraries`).

    Returns
    -------
    SharedPool
        The pool, what was wired (:attr:`SharedPool.libraries`) and :meth:`SharedPool.undo`.

    Raises
    ------
    NotSupportedError
        On a device without memory pools (TCC, some vGPU and WSL setups) or on the ``"sync"`` strategy: the
        message names the alternative, cudacore's callback allocators (``cudacore.interop``). Also for a
        ``max_size`` on a driver before CUDA 12.2, and ``ipc`` where the driver refuses exportable pools.
    IllegalStateError
        While cudacore's allocator has memory handed out (a pool of cudacore's own: share before
        allocating), or when the device shares a pool of another kind already (undo it first).
    CaptureError
        While a stream captures.
    InvalidValueError
        For a negative size, a ``max_size`` or ``ipc`` with ``pool="default"``, an unknown library or
        ``pool``.
    """
    if pool not in ("own", "default"):
        raise error("CUDA_ERROR_INVALID_VALUE", f"pool must be \"own\" or \"default\", not {pool!r}", op=_OP)
    threshold = _bytes_arg("release_threshold", release_threshold, zero=True)
    cap = _bytes_arg("max_size", max_size, zero=False)
    if not isinstance(ipc, bool):
        raise TypeError(f"ipc must be a bool, not {type(ipc).__name__}")
    chosen = _libraries_arg(libraries)
    dev = as_device(device)
    ordinal = dev.device_id
    args = (ordinal, pool == "default", -1 if threshold is None else threshold, cap or 0, ipc)
    with _lock:
        info = json.loads(core.PoolShare(*args))
        sp = _active.get(ordinal)
        if sp is None or sp.closed:
            sp = SharedPool(dev, info, threshold)
            _active[ordinal] = sp
        else:
            sp._threshold = threshold
        for name in chosen:
            if name not in sp._wired or not sp._wired[name].wiring.wired:
                sp._wired[name] = _wire(name, sp)
        # A library's wiring may set the pool's release threshold (CuPy's MemoryAsyncPool sets the
        # maximum): the one asked here is set again, last.
        core.PoolShare(*args)
        cupy = sp._wired.get("cupy")
        if cupy is not None and cupy.wiring.wired and threshold is not None:
            warnings.warn(
                f"CuPy reads the shared pool's release threshold ({format_bytes(threshold)}) as its limit: CuPy's "
                "allocations fail once the pool would grow beyond it; release_threshold=None avoids that",
                RuntimeWarning,
                stacklevel=2,
            )
        return sp


def shared_pool(device: Device | int | None = None) -> SharedPool | None:
    """The :class:`SharedPool` of ``device`` (None: the current device), or None while it shares none."""
    ordinal = as_device(device).device_id
    with _lock:
        sp = _active.get(ordinal)
        return None if sp is None or sp.closed else sp


def shared_pool_of(ordinal: int) -> SharedPool | None:
    """:func:`shared_pool` by ordinal, without opening the device (for the out-of-memory hook)."""
    sp = _active.get(ordinal)
    return None if sp is None or sp.closed else sp

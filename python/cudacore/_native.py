"""Loads cudacore's compiled extension: the gopy-generated module and the METH_FASTCALL fast path.

Both live in one shared library, _gopy/_core<EXT_SUFFIX>, built by bindings/cmd/build (one Go runtime per
process: two Go c-shared libraries in one process crash).

- ``core``: the cold door's functions, one per facade function (``core.Noop(5)``): generated METH_FASTCALL
  wrappers of gopy's exports where every argument and the result are scalars (``fast.cold``), else
  gopy's generated C functions, or gopy's Python wrapper where it converts an argument. The generated
  wrappers raise the typed exception of a Go error themselves; the others raise RuntimeError with the
  wire-format message, which ``_api.call`` turns into the typed exception.
- ``fast``: the hand-written module ``cudacore._fast`` (cudacore/native; fast.h lists its files), loaded from the same file.
  CPython dlopens the same path again, which returns the same handle, and calls PyInit__fast.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

__all__ = ["core", "fast"]


def _import_core() -> ModuleType:
    # gopy's generated module chdirs into its own directory while it imports (so that its relative dlopen
    # works) and only changes back if the import succeeds; put the working directory back in every case.
    cwd = os.getcwd()
    try:
        from cudacore._gopy import cudacore as gen
    finally:
        os.chdir(cwd)
    return gen


def _load_fast(ext_path: str) -> ModuleType:
    name = "cudacore._fast"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, ext_path)
    spec = importlib.util.spec_from_file_location(name, ext_path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {name} from {ext_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


#: gopy's Python wrapper of each C function that ``core`` holds directly, by the C function's name: the C
#: guard reads a wrapper's parameter names for an error message.
gopy_wrappers: dict[str, Any] = {}


def _direct(gen: ModuleType, cold: ModuleType) -> SimpleNamespace:
    """gopy's functions, each replaced by a C function when gopy's Python wrapper only passes its
    parameters on (``return _core.cudacore_<Name>(<its parameters>)``): a cold call then runs no Python
    frame of gopy's. The C function is the generated METH_FASTCALL wrapper of gopy's export where every
    parameter and the result are scalars (``fast.cold``, bindings/door's GenerateCold), else pybindgen's
    wrapper in the extension. Wrappers that convert an argument (a Go slice's handle) are kept."""
    ext = sys.modules["cudacore._gopy._core"]
    out = SimpleNamespace()
    gopy_wrappers.clear()
    for name, fn in vars(gen).items():
        code = getattr(fn, "__code__", None)
        raw = getattr(cold, "cudacore_" + name, None) or getattr(ext, "cudacore_" + name, None)
        if (
            code is not None
            and raw is not None
            and code.co_names == ("_core", "cudacore_" + name)
            and code.co_varnames == code.co_varnames[: code.co_argcount]
        ):
            setattr(out, name, raw)
            gopy_wrappers[raw.__name__] = fn
        elif callable(fn) and not name.startswith("_"):
            setattr(out, name, fn)
    return out


_gen = _import_core()
# The extension module gopy's wrapper imported (cudacore._gopy._core): its file is the shared library.
_ext_file = sys.modules["cudacore._gopy._core"].__file__
if _ext_file is None:  # an extension module always has a file; this keeps the type checker honest
    raise ImportError("cudacore._gopy._core has no file: cannot load the fast path from it")
fast = _load_fast(_ext_file)
core = _direct(_gen, fast.cold)

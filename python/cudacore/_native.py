"""Loads cudacore's compiled extension: the gopy-generated module and the METH_FASTCALL fast path.

Both live in one shared library, _gopy/_core<EXT_SUFFIX>, built by bindings/cmd/build (one Go runtime per
process: two Go c-shared libraries in one process crash).

- ``core``: gopy's Python wrapper of the Go facade package (``core.Noop(5)``). Its calls raise RuntimeError
  with the wire-format message; the package's public layer turns that into typed exceptions.
- ``fast``: the hand-written module ``cudacore._fast`` (bindings/fastpath.c), loaded from the same file.
  CPython dlopens the same path again, which returns the same handle, and calls PyInit__fast.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

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


core = _import_core()
# The extension module gopy's wrapper imported (cudacore._gopy._core): its file is the shared library.
_ext_file = sys.modules["cudacore._gopy._core"].__file__
if _ext_file is None:  # an extension module always has a file; this keeps the type checker honest
    raise ImportError("cudacore._gopy._core has no file: cannot load the fast path from it")
fast = _load_fast(_ext_file)

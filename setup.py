"""Builds cudacore's extension with Go; everything declarative is in pyproject.toml.

The extension is one Go c-shared library built by bindings/cmd/build for the Python running this build
(sys.executable): gopy's module cudacore._gopy._core plus the fast path cudacore._fast in the same file. The
build needs Go 1.26 or newer and C and C++ compilers (gcc, g++: the PyTorch allocator shim is C++); the Go
modules are vendored, and pybindgen comes from pyproject's build requirements. The wheel this builds links
the build machine's C library (linux_x86_64); `make wheels` makes the manylinux ones (docs/contributing/building.md).
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class GoExtension(Extension):
    """An extension whose sources are Go: declaring it makes the wheel platform-specific (cpXY-linux_x86_64)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class BuildGo(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, GoExtension):
            return super().build_extension(ext)
        # get_ext_fullpath is build/lib.../cudacore/_gopy/_core<EXT_SUFFIX>, or the source tree with
        # --inplace; the Go build writes the extension under that same name and gopy's generated Python
        # files (and the GIL policy manifest) beside it.
        out = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        cmd = ["go", "run", "./bindings/cmd/build", "-python", sys.executable, "-out", out]
        self.announce(" ".join(cmd), level=2)
        try:
            subprocess.check_call(cmd, cwd=ROOT)
        except FileNotFoundError as e:
            raise SystemExit("building cudacore needs the Go toolchain (Go 1.26 or newer, go) on PATH") from e
        if getattr(self, "editable_mode", False):
            # pip install -e: the package is imported from python/, and setuptools copies only the extension
            # there (into a directory it expects to exist); gopy's Python files must be there too.
            src = os.path.join(ROOT, "python", *ext.name.split(".")[:-1])
            shutil.copytree(out, src, dirs_exist_ok=True)


setup(
    ext_modules=[GoExtension("cudacore._gopy._core")],
    cmdclass={"build_ext": BuildGo},
)

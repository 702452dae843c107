#!/usr/bin/env bash
# Builds manylinux wheels of cudacore into dist/, one per Python interpreter given (docs/contributing/building.md):
#
#   scripts/wheels.sh /path/to/python3.11 /path/to/python3.12 ...      (make wheels runs this)
#
# Each wheel is built by `pip wheel` (setup.py -> bindings/cmd/build) with zig's C compiler standing in
# for gcc, so that the extension links against glibc MANYLINUX_GLIBC (default 2.28) rather than this
# machine's newer one; the C++ of the PyTorch shim is compiled against this machine's libstdc++ headers
# and links the system libstdc++.so.6 and libgcc_s.so.1 dynamically, so that a C++ exception it throws
# unwinds through PyTorch with the one runtime PyTorch uses. auditwheel then checks every symbol
# version against the policy and tags the wheel; a wheel that needs more fails here.
#
# PKG_PYTHON is the packaging environment's Python (ziglang and auditwheel; make pkg-venv). PIP_WHEEL_ARGS
# go to pip wheel (scripts/check_dist.sh passes --no-build-isolation to build with no index).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 PYTHON..." >&2; exit 2; }
PKG_PYTHON=${PKG_PYTHON:-build/pkg-venv/bin/python}
GLIBC=${MANYLINUX_GLIBC:-2.28}
PLAT=manylinux_${GLIBC/./_}_x86_64
[ "$(uname -m)" = x86_64 ] || { echo "$0: builds x86_64 wheels only" >&2; exit 1; }

zig=$("$PKG_PYTHON" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
target=x86_64-linux-gnu.$GLIBC
# libstdc++'s own include directories, in g++'s order; -I (not -isystem) puts them before zig's libc
# headers, which their #include_next <stdlib.h> and friends must find next.
cxx_includes=$(echo | g++ -x c++ -E -v - 2>&1 | sed -n '/#include <...> search starts here/,/End of search/p' |
    awk '$1 ~ /\/c\+\+\// { printf " -I%s", $1 }')
libstdcxx=$(g++ -print-file-name=libstdc++.so.6)
libgcc_s=$(g++ -print-file-name=libgcc_s.so.1)
[ -f "$libstdcxx" ] && [ -f "$libgcc_s" ] || { echo "$0: g++'s libstdc++.so.6 or libgcc_s.so.1 not found" >&2; exit 1; }
# Python.h's pyconfig.h redefines _POSIX_C_SOURCE after zig's glibc headers set a newer value; harmless.
export CC="$zig cc -target $target -Wno-macro-redefined"
export CXX="$zig c++ -target $target -nostdinc++ -nostdlib++$cxx_includes"
export CGO_LDFLAGS="$libstdcxx $libgcc_s"
export CGO_ENABLED=1

mkdir -p dist
raw=build/wheelhouse
for py in "$@"; do
    py=$(command -v "$py") || { echo "$0: no interpreter $py" >&2; exit 1; }
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    echo "== $tag ($py)"
    rm -rf "$raw" && mkdir -p "$raw"
    "$py" -m pip wheel --quiet --no-deps --disable-pip-version-check --wheel-dir "$raw" ${PIP_WHEEL_ARGS:-} .
    rm -f dist/cudacore-*-"$tag"-"$tag"-*.whl
    # --only-plat: the tag is the glibc the build targeted, even where auditwheel finds an older one would do.
    PATH="$(dirname "$PKG_PYTHON"):$PATH" "$PKG_PYTHON" -m auditwheel repair --plat "$PLAT" --only-plat \
        --wheel-dir dist "$raw"/cudacore-*-"$tag"-*.whl
done
rm -rf "$raw"
ls -l dist/*.whl

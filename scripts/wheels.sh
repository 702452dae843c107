#!/usr/bin/env bash
# Builds manylinux wheels of cudacore into dist/, one per Python interpreter given (docs/contributing/building.md):
#
#   scripts/wheels.sh /path/to/python3.11 /path/to/python3.12 ...      (make wheels runs this)
#   WHEEL_ARCH=aarch64 scripts/wheels.sh /path/to/python3.12           (make wheels WHEEL_ARCH=aarch64)
#
# Each wheel is built by `pip wheel` (setup.py -> bindings/cmd/build) with zig's C compiler standing in
# for gcc, so that the extension links against glibc MANYLINUX_GLIBC (default 2.28) rather than this
# machine's newer one; the C++ of the PyTorch shim is compiled against libstdc++'s headers and links
# libstdc++.so.6 and libgcc_s.so.1 dynamically, so that a C++ exception it throws unwinds through PyTorch
# with the one runtime PyTorch uses. auditwheel then checks every symbol version against the policy and
# tags the wheel; a wheel that needs more fails here.
#
# WHEEL_ARCH is the machine the wheels are for: x86_64 or aarch64, this machine's by default. For the
# machine's own, libstdc++ is g++'s. For the other one (the aarch64 wheels are cross-built on x86-64),
# zig targets it, libstdc++'s headers and the two libraries come from Debian's packages of GCC
# CROSS_GCC for that architecture (scripts/debian_sysroot.sh unpacks them into build/), and
# _PYTHON_HOST_PLATFORM names the target, which setuptools tags the wheel with and bindings/cmd/build
# builds for (GOARCH, and the target's EXT_SUFFIX). The interpreters given are this machine's: they supply
# the version and Python.h, whose pyconfig.h holds no value that differs between x86-64 and aarch64 Linux
# in what the extension compiles (docs/contributing/building.md says what was compared).
#
# PKG_PYTHON is the packaging environment's Python (ziglang and auditwheel; make pkg-venv). PIP_WHEEL_ARGS
# go to pip wheel (scripts/check_dist.sh passes --no-build-isolation to build with no index).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 PYTHON..." >&2; exit 2; }
PKG_PYTHON=${PKG_PYTHON:-build/pkg-venv/bin/python}
GLIBC=${MANYLINUX_GLIBC:-2.28}
HOST_ARCH=$(uname -m)
ARCH=${WHEEL_ARCH:-$HOST_ARCH}
# The Debian suite and GCC of the C++ runtime a cross build compiles and links against (GCC 12, as g++ on
# the Debian 12 machines that build the x86-64 wheels).
CROSS_SUITE=${CROSS_SUITE:-bookworm}
CROSS_GCC=${CROSS_GCC:-12}
case $ARCH in
    x86_64) deb_arch=amd64 ;;
    aarch64) deb_arch=arm64 ;;
    *) echo "$0: WHEEL_ARCH=$ARCH: wheels are built for x86_64 and aarch64" >&2; exit 2 ;;
esac
PLAT=manylinux_${GLIBC/./_}_$ARCH

zig=$("$PKG_PYTHON" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
target=$ARCH-linux-gnu.$GLIBC
if [ "$ARCH" = "$HOST_ARCH" ]; then
    # libstdc++'s own include directories, in g++'s order; -I (not -isystem) puts them before zig's libc
    # headers, which their #include_next <stdlib.h> and friends must find next.
    cxx_includes=$(echo | g++ -x c++ -E -v - 2>&1 | sed -n '/#include <...> search starts here/,/End of search/p' |
        awk '$1 ~ /\/c\+\+\// { printf " -I%s", $1 }')
    libstdcxx=$(g++ -print-file-name=libstdc++.so.6)
    libgcc_s=$(g++ -print-file-name=libgcc_s.so.1)
else
    sysroot=build/sysroot-$ARCH-gcc$CROSS_GCC
    scripts/debian_sysroot.sh --no-deps "$deb_arch" "$CROSS_SUITE" "$sysroot" \
        "libstdc++-$CROSS_GCC-dev" libstdc++6 libgcc-s1
    sysroot=$PWD/$sysroot
    # The same three directories as g++ there would search, in its order.
    cxx_includes=" -I$sysroot/usr/include/c++/$CROSS_GCC -I$sysroot/usr/include/$ARCH-linux-gnu/c++/$CROSS_GCC"
    cxx_includes+=" -I$sysroot/usr/include/c++/$CROSS_GCC/backward"
    libstdcxx=$sysroot/usr/lib/$ARCH-linux-gnu/libstdc++.so.6
    libgcc_s=$sysroot/lib/$ARCH-linux-gnu/libgcc_s.so.1
    export _PYTHON_HOST_PLATFORM=linux-$ARCH
    ldpaths=$sysroot/usr/lib/$ARCH-linux-gnu:$sysroot/lib/$ARCH-linux-gnu
fi
[ -f "$libstdcxx" ] && [ -f "$libgcc_s" ] || { echo "$0: $ARCH's libstdc++.so.6 or libgcc_s.so.1 not found" >&2; exit 1; }
# Python.h's pyconfig.h redefines _POSIX_C_SOURCE after zig's glibc headers set a newer value; harmless.
export CC="$zig cc -target $target -Wno-macro-redefined"
export CXX="$zig c++ -target $target -nostdinc++ -nostdlib++$cxx_includes"
export CGO_LDFLAGS="$libstdcxx $libgcc_s"
export CGO_ENABLED=1

# repair WHEEL: auditwheel checks WHEEL against the manylinux policy of GLIBC (every versioned symbol, and
# no library outside the policy's list) and writes it into dist/ tagged PLAT: the glibc the build targeted,
# even where auditwheel finds that an older one would do (--only-plat).
repair() {
    local auditwheel=(env PATH="$(dirname "$PKG_PYTHON"):$PATH" "$PKG_PYTHON" -m auditwheel)
    if [ "$ARCH" = "$HOST_ARCH" ]; then
        "${auditwheel[@]}" repair --plat "$PLAT" --only-plat --wheel-dir dist "$1"
        return
    fi
    # For another architecture auditwheel offers no --plat but auto: it reads the architecture from the
    # wheel's name, checks the wheel against that architecture's policies as above (resolving libraries
    # among the target's, in the sysroot) and tags it with the most compatible policy it meets. That one
    # must be no newer than GLIBC; the wheel is then tagged PLAT, as above.
    rm -rf "$raw/repaired"
    "${auditwheel[@]}" repair --plat auto --only-plat --ldpaths "$ldpaths" --wheel-dir "$raw/repaired" "$1"
    local met
    met=$(basename "$raw"/repaired/*.whl .whl)
    met=${met##*-}
    [[ $met =~ ^manylinux_([0-9]+)_([0-9]+)_$ARCH$ ]] || { echo "$0: auditwheel tagged the wheel $met" >&2; exit 1; }
    met=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
    [ "$(printf '%s\n' "$met" "$GLIBC" | sort -V | tail -n 1)" = "$GLIBC" ] ||
        { echo "$0: the wheel needs glibc $met, newer than the $GLIBC targeted" >&2; exit 1; }
    "$PKG_PYTHON" -m wheel tags --remove --platform-tag "$PLAT" "$raw"/repaired/*.whl >/dev/null
    mv "$raw"/repaired/*.whl dist/
    echo "auditwheel: consistent with manylinux_${met/./_}_$ARCH; tagged $PLAT"
}

mkdir -p dist
raw=build/wheelhouse
for py in "$@"; do
    py=$(command -v "$py") || { echo "$0: no interpreter $py" >&2; exit 1; }
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    echo "== $tag $ARCH ($py)"
    rm -rf "$raw" && mkdir -p "$raw"
    "$py" -m pip wheel --quiet --no-deps --disable-pip-version-check --wheel-dir "$raw" ${PIP_WHEEL_ARGS:-} .
    rm -f dist/cudacore-*-"$tag"-"$tag"-*_"$ARCH".whl
    repair "$raw"/cudacore-*-"$tag"-*_"$ARCH".whl
done
rm -rf "$raw"
ls -l dist/*_"$ARCH".whl

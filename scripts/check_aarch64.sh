#!/usr/bin/env bash
# The aarch64 wheel's check under emulation, from the repository root (make check-aarch64;
# docs/contributing/building.md):
#
#   scripts/check_aarch64.sh [WHEEL]
#
#  1. unpack an aarch64 Debian with its CPython: the arm64 packages of python$AARCH64_PYTHON and
#     libstdc++6 with everything they depend on, and qemu-aarch64 from Debian 13's qemu-user for this
#     machine (statically linked, so it needs nothing from it); scripts/debian_sysroot.sh fetches them into
#     build/aarch64-check without root, and nothing is registered with the kernel (no binfmt_misc);
#  2. make an environment like a virtual environment whose bin/python runs that CPython under qemu-aarch64,
#     with sys.executable pointing back at it, so that every Python subprocess a test starts runs emulated
#     too; this machine's pip installs the wheel and AARCH64_TEST_TOOLS (aarch64 wheels from PyPI) into it;
#  3. check the wheel: its tag, an AArch64 extension that is stripped and has no RUNPATH, and the symbol
#     versions it needs (auditwheel show, which reads the architecture from the wheel's name);
#  4. there, on the simulator: import cudacore from outside the sources (platform.machine() must be
#     aarch64), run `cudacore doctor` and the quick start; check that the PyTorch shim's C++ exception
#     reaches a program built against that Debian's own libstdc++ (scripts/shim_probe.cc, as make
#     dist-check does for x86-64; zig's compiler builds it there, with the suite's GCC headers and
#     libraries); and run AARCH64_TESTS against the installed wheel;
#  5. cross-compile the Go tests of AARCH64_GO_PACKAGES for arm64 (cgo through zig's compiler, as the
#     wheel) and run them under qemu-aarch64 too.
#
# AARCH64_PYTHON is the CPython checked, 3.13 by default: the Debian suite is the one that has it (13,
# trixie, has 3.13 and 12, bookworm, 3.11; none has 3.12 any more). WHEEL defaults to dist/'s cudacore
# wheel for it (make wheels WHEEL_ARCH=aarch64 builds it). PKG_PYTHON is the packaging environment's
# Python (auditwheel; make pkg-venv), whose pip installs into the emulated environment.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PKG_PYTHON=${PKG_PYTHON:-$root/build/pkg-venv/bin/python}
AARCH64_PYTHON=${AARCH64_PYTHON:-3.13}
AARCH64_TEST_TOOLS=${AARCH64_TEST_TOOLS:-pytest==9.2.0 numpy==2.4.6}
# The quick part of the suite: emulation runs Python about ten times slower than this machine, so not the
# whole suite (the fuzzers, stress runs, docs and typing checks test nothing that depends on the machine).
# These files exercise what does: the Go core through every door (allocation, streams, events, errors and
# their typed exceptions, limits), the C fast path and its hot methods against the general path (C compiled
# for aarch64, its atomics and the recycle log's lock under aarch64's weaker memory ordering), and the
# simulator's fault injection. Left out of them: the 20,000 rounds of the recycle log's race with another
# thread (two minutes emulated), since qemu on x86-64 keeps x86-64's stronger memory ordering and so cannot
# show the reorderings that race is about; and the two tests that interrupt a wait with a SIGINT the
# process sends itself, since signals are emulated too: within a whole run, the synchronize one once
# waited for its SIGINT for good (it passed alone 12 times out of 12, and in the other whole runs).
AARCH64_TESTS=${AARCH64_TESTS:-tests/test_device.py tests/test_memory.py tests/test_streams.py tests/test_errors.py \
tests/test_limits.py tests/test_recycle.py tests/test_direct.py tests/test_hot_path_agreement.py tests/test_doctor.py \
--deselect tests/test_recycle.py::test_a_call_into_go_waits_for_a_replay_in_progress_on_another_thread \
--deselect tests/test_streams.py::test_synchronize_is_interruptible \
--deselect tests/test_streams.py::test_event_synchronize_is_interruptible}
# The most the tests may take before the check fails rather than wait (a few times their usual time).
AARCH64_TESTS_TIMEOUT=${AARCH64_TESTS_TIMEOUT:-1200}
# The Go packages with C code (the driver shim, the recycle log with its spin lock and atomics, the fast
# path's snapshot, the process checks) and the one with a per-machine constant (limits.AddressSpace).
# TestBurstTimesAreDistinctAndIncreasing is left out: it bounds the wall-clock time of a burst of calls,
# which emulation does not meet.
AARCH64_GO_PACKAGES=${AARCH64_GO_PACKAGES:-./pkg/cuda/libcuda/... ./cudacore/internal/recycle \
./cudacore/internal/snapshot ./cudacore/internal/process ./pkg/limits}
AARCH64_GO_SKIP=${AARCH64_GO_SKIP:-TestBurstTimesAreDistinctAndIncreasing}
fail() { echo "check-aarch64: $*" >&2; exit 1; }

case $AARCH64_PYTHON in
    3.13) suite=trixie gcc=14 ;;
    3.11) suite=bookworm gcc=12 ;;
    *) fail "AARCH64_PYTHON=$AARCH64_PYTHON: Debian has CPython 3.13 (trixie) and 3.11 (bookworm) for arm64" ;;
esac
py=python$AARCH64_PYTHON
tag=cp${AARCH64_PYTHON/./}
wheel=${1:-$(ls dist/cudacore-*-"$tag"-"$tag"-manylinux_*_aarch64.whl 2>/dev/null | tail -n 1)}
[ -n "$wheel" ] && [ -f "$wheel" ] ||
    fail "no $tag aarch64 wheel in dist/: make wheels WHEEL_ARCH=aarch64 WHEEL_PYTHONS=<a CPython $AARCH64_PYTHON>"
wheel=$(realpath "$wheel")
work=$root/build/aarch64-check
sysroot=$work/sysroot-$suite

echo "== 1. Debian $suite arm64 with $py, and qemu-aarch64"
t0=$(date +%s)
scripts/debian_sysroot.sh arm64 "$suite" "$sysroot" "$py" libstdc++6
scripts/debian_sysroot.sh --no-deps amd64 trixie "$work/qemu" qemu-user
qemu=$work/qemu/usr/bin/qemu-aarch64
# Only qemu-aarch64 is used; the other targets' emulators are most of the package's 450 MB.
find "$work/qemu/usr/bin" -name 'qemu-*' ! -name qemu-aarch64 -delete
[ -x "$qemu" ] && [ -x "$sysroot/usr/bin/$py" ] || fail "qemu-aarch64 or $py missing after unpacking"
"$qemu" --version | head -n 1

echo "== 2. an emulated environment with $(basename "$wheel") and $AARCH64_TEST_TOOLS"
env=$work/env
rm -rf "$env"
mkdir -p "$env/bin"
site=$env/lib/$py/site-packages
# A virtual environment's layout: CPython finds pyvenv.cfg beside bin/ and takes its prefix from it; home
# is the base interpreter's folder, which qemu-aarch64 -L looks up in the sysroot, as every absolute path.
version=$("$qemu" -L "$sysroot" "$sysroot/usr/bin/$py" -c 'import platform; print(platform.python_version())')
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "$version" >"$env/pyvenv.cfg"
# -0 gives CPython the wrapper's path as argv[0], from which it computes sys.executable and the prefix.
# Debian's packages ship no bytecode (their installation compiles it), and the sysroot's folders are not
# where CPython would write it: a path that does not exist in the sysroot is this machine's, so the
# bytecode of the standard library would go to this machine's /usr/lib/python3.X if it has one. All of
# it goes to one folder of the check instead (PYTHONPYCACHEPREFIX), made once and read by every process;
# without it (PYTHONDONTWRITEBYTECODE), every process would compile what it imports again, under emulation.
cat >"$env/bin/python" <<EOF
#!/bin/sh
export PYTHONPYCACHEPREFIX="$work/pycache-$suite"
unset PYTHONDONTWRITEBYTECODE
exec "$qemu" -L "$sysroot" -0 "\$0" "$sysroot/usr/bin/$py" "\$@"
EOF
chmod +x "$env/bin/python"
ln -s python "$env/bin/$py"
glibc=$("$env/bin/python" -c 'import platform; print(platform.libc_ver()[1])')
platforms=()
for minor in $(seq 17 "${glibc#2.}"); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
"$PKG_PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile --target "$site" \
    --only-binary=:all: --implementation cp --python-version "$AARCH64_PYTHON" --abi "$tag" "${platforms[@]}" \
    "$wheel" $AARCH64_TEST_TOOLS
# The console script pip wrote names this machine's Python; it is to run under the emulated one.
sed "1s|.*|#!$env/bin/python|" "$site/bin/cudacore" >"$env/bin/cudacore"
chmod +x "$env/bin/cudacore"
echo "$env: CPython $version, glibc $glibc (set up in $(($(date +%s) - t0)) s)"

echo "== 3. $(basename "$wheel")"
case $wheel in *-"$tag"-"$tag"-manylinux_2_28_aarch64.whl) ;; *) fail "$wheel is not tagged $tag-manylinux_2_28_aarch64" ;; esac
so=$(ls "$site"/cudacore/_gopy/_core.cpython-"${tag#cp}"-aarch64-linux-gnu.so) || fail "no aarch64 extension in the wheel"
readelf -hW "$so" | grep -q 'Machine:.*AArch64' || fail "$so is not an AArch64 ELF"
! readelf -SW "$so" | grep -q -e '\.symtab' -e '\.debug_' || fail "$so is not stripped"
! readelf -dW "$so" | grep -q -e RUNPATH -e RPATH || fail "$so has a run-time search path: $(readelf -dW "$so" | grep PATH)"
"$PKG_PYTHON" -m auditwheel show "$wheel"

echo "== 4. on the emulated aarch64, simulator backend"
run() { env PATH="$env/bin:$PATH" CUDACORE_BACKEND=sim "$@"; }
t0=$(date +%s)
(cd "$work" && run python -c '
import platform, sys
import cudacore
assert platform.machine() == "aarch64", platform.machine()
assert cudacore.__file__.startswith(sys.prefix), cudacore.__file__
print(cudacore.__file__, "on", platform.machine(), "CPython", platform.python_version())
')
(cd "$work" && run cudacore doctor)
(cd "$work" && run python "$root/examples/quickstart.py")
# The shim probe: libstdc++'s and Python's headers and libpython come from the suite's own packages.
dev=$work/probe-dev-$suite
scripts/debian_sysroot.sh --no-deps arm64 "$suite" "$dev" "libstdc++-$gcc-dev" "lib$py-dev" "lib$py"
zig=$("$PKG_PYTHON" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
"$zig" c++ -target "aarch64-linux-gnu.$glibc" -O1 -nostdinc++ -nostdlib++ -Wno-macro-redefined \
    -I"$dev/usr/include/c++/$gcc" -I"$dev/usr/include/aarch64-linux-gnu/c++/$gcc" -I"$dev/usr/include/c++/$gcc/backward" \
    -I"$dev/usr/include/$py" -I"$dev/usr/include" -o "$work/shim_probe" scripts/shim_probe.cc \
    "$dev/usr/lib/aarch64-linux-gnu/lib$py.so.1.0" "$sysroot/usr/lib/aarch64-linux-gnu/libstdc++.so.6" \
    "$sysroot/usr/lib/aarch64-linux-gnu/libgcc_s.so.1"
(cd "$work" && run env PYTHONPATH="$site" PYTHONPYCACHEPREFIX="$work/pycache-$suite" \
    LD_LIBRARY_PATH="$dev/usr/lib/aarch64-linux-gnu" "$qemu" -L "$sysroot" "$work/shim_probe")
echo "imported, doctor, quick start and the shim probe in $(($(date +%s) - t0)) s"
t0=$(date +%s)
# shellcheck disable=SC2086  # AARCH64_TESTS is a list of paths
run timeout "$AARCH64_TESTS_TIMEOUT" python -m pytest -q -p no:cacheprovider -rfE $AARCH64_TESTS ||
    fail "the tests failed, or ran past $AARCH64_TESTS_TIMEOUT s (exit $?)"
echo "tests in $(($(date +%s) - t0)) s"

echo "== 5. Go tests for arm64 under qemu-aarch64: $AARCH64_GO_PACKAGES"
t0=$(date +%s)
# shellcheck disable=SC2086  # AARCH64_GO_PACKAGES is a list of packages
env GOARCH=arm64 CGO_ENABLED=1 CC="$zig cc -target aarch64-linux-gnu.2.28" \
    go test -count=1 -skip "$AARCH64_GO_SKIP" -exec "$qemu -L $sysroot" $AARCH64_GO_PACKAGES
echo "Go tests in $(($(date +%s) - t0)) s"

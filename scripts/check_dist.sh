#!/usr/bin/env bash
# The release check (make dist-check; CI runs it), from the repository root (docs/contributing/building.md):
#
#  1. build the sdist and check that it has every tracked file but CI's own;
#  2. unpack it and build a manylinux wheel from it with no network: GOPROXY=off, GOFLAGS=-mod=vendor, an
#     empty module cache, GOTOOLCHAIN=local and no package index (pip --no-build-isolation, the build tools
#     coming from the packaging environment);
#  3. check the wheel: auditwheel's policy, a stripped extension with no RUNPATH, `twine check --strict` of both files;
#  4. install it into a fresh virtual environment with no Go on PATH (timed), import it from outside the
#     sources, run `cudacore doctor` and the quick start on the simulator, and check that the PyTorch
#     shim's C++ exception reaches a program built with the system's libstdc++ (scripts/shim_probe.cc);
#  5. run SDIST_TESTS from the unpacked sdist against the installed wheel (pytest and numpy are installed
#     into that environment from the package index first). Not the whole suite: the pytest plugin's and
#     the notebook's tests run the source tree's python/ (docs/contributing/building.md says how to run it all).
#
# PKG_PYTHON is the packaging environment's Python (make pkg-venv); the wheel is for its base interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PKG_PYTHON=${PKG_PYTHON:-$root/build/pkg-venv/bin/python}
SDIST_TESTS=${SDIST_TESTS:-tests/test_doctor.py tests/test_readme.py tests/test_errors.py tests/test_kernels.py}
base=$("$PKG_PYTHON" -c 'import sys; print(sys._base_executable)')
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "dist-check: $*" >&2; exit 1; }

echo "== 1. sdist"
rm -f dist/cudacore-*.tar.gz
"$PKG_PYTHON" -m build --sdist --no-isolation --outdir dist . >"$tmp/sdist.log" 2>&1 || { cat "$tmp/sdist.log"; exit 1; }
sdist=$(ls dist/cudacore-*.tar.gz)
tar -xzf "$sdist" -C "$tmp"
src=$(ls -d "$tmp"/cudacore-*/)
src=${src%/}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    missing=$(git ls-files | grep -v -e '^\.ci/' -e '^\.gitignore$' | while read -r f; do [ -e "$src/$f" ] || echo "$f"; done)
    [ -z "$missing" ] || fail "the sdist lacks tracked files:"$'\n'"$missing"
fi
ls -l "$sdist"

echo "== 2. wheel from the unpacked sdist, offline"
mkdir -p "$tmp/gomodcache"
(cd "$src" && env GOPROXY=off GOFLAGS=-mod=vendor GOMODCACHE="$tmp/gomodcache" GOTOOLCHAIN=local GONOSUMDB= \
    PIP_NO_INDEX=1 PIP_WHEEL_ARGS=--no-build-isolation PKG_PYTHON="$PKG_PYTHON" \
    scripts/wheels.sh "$PKG_PYTHON" >"$tmp/wheel.log" 2>&1) || { tail -40 "$tmp/wheel.log"; fail "the offline wheel build failed"; }
[ -z "$(ls -A "$tmp/gomodcache")" ] || fail "the offline build used the module cache, not vendor/"
wheel=$(ls "$src"/dist/cudacore-*.whl)
mkdir -p dist && cp "$wheel" dist/
wheel=dist/$(basename "$wheel")

echo "== 3. $wheel"
case $wheel in *-manylinux_2_28_x86_64.whl) ;; *) fail "$wheel is not tagged manylinux_2_28_x86_64" ;; esac
"$PKG_PYTHON" -m auditwheel show "$wheel"
mkdir "$tmp/unzipped"
"$PKG_PYTHON" -m zipfile -e "$wheel" "$tmp/unzipped"
so=$(ls "$tmp"/unzipped/cudacore/_gopy/_core.*.so)
sections=$(readelf -SW "$so")
! grep -q -e '\.symtab' -e '\.debug_' <<<"$sections" || fail "$so is not stripped"
! readelf -dW "$so" | grep -q -e RUNPATH -e RPATH || fail "$so has a run-time search path of the build machine"
"$PKG_PYTHON" -m twine check --strict "$sdist" "$wheel"
echo "wheel $(stat -c %s "$wheel") bytes; extension $(stat -c %s "$so") bytes"

echo "== 4. install into a fresh environment without Go"
nogo=
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do [ -x "$d/go" ] || nogo=${nogo:+$nogo:}$d; done
run() { env PATH="$tmp/venv/bin:$nogo" CUDACORE_BACKEND=sim "$@"; }
"$base" -m venv "$tmp/venv"
! run bash -c 'command -v go' >/dev/null || fail "go is still on PATH"
t0=$(date +%s.%N)
run pip install --quiet --no-index --no-deps --disable-pip-version-check "$root/$wheel"
t1=$(date +%s.%N)
echo "installed in $("$base" -c "print(round($t1 - $t0, 2))") s"
cd "$tmp"
run python -c 'import cudacore, sys; assert cudacore.__file__.startswith(sys.prefix), cudacore.__file__; print(cudacore.__file__)'
run cudacore doctor
run python "$src/examples/quickstart.py" >"$tmp/quickstart.log" || { cat "$tmp/quickstart.log"; fail "the quick start failed"; }
# The PyTorch shim's C++ exception reaches a program built with the system's libstdc++ (scripts/shim_probe.cc).
[ -x "$base-config" ] || fail "no $base-config (the Python development files)"
# shellcheck disable=SC2046  # the config's flags are words
g++ -O1 -o "$tmp/shim_probe" "$src/scripts/shim_probe.cc" $("$base-config" --includes) $("$base-config" --embed --ldflags)
run env PYTHONPATH="$(run python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" "$tmp/shim_probe"

echo "== 5. tests from the unpacked sdist against the installed wheel: $SDIST_TESTS"
run pip install --quiet --disable-pip-version-check pytest numpy
cd "$src"
# shellcheck disable=SC2086  # SDIST_TESTS is a list of paths
run python -m pytest -q -p no:cacheprovider $SDIST_TESTS

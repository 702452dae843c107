#!/usr/bin/env bash
# Fetches the peers' own test suites that scripts/gpu/peer_suites.py runs on the GPU machine (which has no
# network), into peer-suites/ (ignored by git; carry it to the GPU machine). Versions are pinned here.
#
#   scripts/fetch_peer_suites.sh [CUPY_VERSION]
#
# - CuPy: the tests/ folder of the CuPy source release from PyPI, checked against its sha256. The version
#   must match the CuPy installed on the GPU machine (docs/contributing/gpu-testing.md names it).
# - PyTorch: test/test_cuda.py is not on PyPI (PyTorch publishes no sdist). Put the file of the pinned
#   commit below at peer-suites/torch/test_cuda.py by hand. The pin is a snapshot of PyTorch's main
#   between the 2.10 and 2.11 branch cuts (every API the file uses exists in torch 2.11.0, the GPU
#   machine's), as a fork (EmanueleCoradin/pytorch) holds it; its common_utils needs the expecttest
#   package, which the GPU machine's Python lacks: carry its wheel.
# - Numba-CUDA: its tests ship inside the installed numba-cuda package. They import cffi and filecheck,
#   which the GPU machine lacks, and use numpy.row_stack, which its numpy (2.5) no longer has: the wheels
#   below (CPython 3.12, pinned) go to peer-suites/wheels/, and peer_suites.py installs them without an
#   index, numpy for the Numba runs alone.
set -euo pipefail
cd "$(dirname "$0")/.."
CUPY_VERSION=${1:-14.2.0}
declare -A CUPY_SHA256=(
    [14.2.0]=cfed725e612178cfbdbf62f4a3a598b60edecbbca718c0d4580c21a16ae4a62c
)
TORCH_COMMIT=010dab67455e07af73b0879059f4288cf9bb8bab

mkdir -p peer-suites/torch
sha=${CUPY_SHA256[$CUPY_VERSION]:-}
[ -n "$sha" ] || { echo "no sha256 pinned for CuPy $CUPY_VERSION: add it to CUPY_SHA256 in $0"; exit 1; }
if [ ! -d "peer-suites/cupy-$CUPY_VERSION/tests" ]; then
    url=$(curl -fsSL "https://pypi.org/simple/cupy/" | grep -o "https://[^\"#]*/cupy-$CUPY_VERSION.tar.gz" | head -1)
    [ -n "$url" ] || { echo "CuPy $CUPY_VERSION's sdist is not on PyPI's index"; exit 1; }
    tmp=$(mktemp -d)
    curl -fsSL -o "$tmp/cupy.tar.gz" "$url"
    echo "$sha  $tmp/cupy.tar.gz" | sha256sum -c --quiet
    tar xzf "$tmp/cupy.tar.gz" -C peer-suites "cupy-$CUPY_VERSION/tests"
    rm -rf "$tmp"
fi
echo "CuPy $CUPY_VERSION tests: peer-suites/cupy-$CUPY_VERSION/tests"
# The suites' test-only dependencies, for the GPU machine's CPython 3.12 (x86-64 Linux).
mkdir -p peer-suites/wheels
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d peer-suites/wheels \
    expecttest==0.3.0 cffi==2.1.1 pycparser==3.12 filecheck==1.0.6 numpy==2.3.5
echo "test-only wheels: peer-suites/wheels"
if [ -f peer-suites/torch/test_cuda.py ]; then
    echo "PyTorch test_cuda.py: peer-suites/torch/test_cuda.py (expected: commit $TORCH_COMMIT)"
else
    echo "PyTorch: put test/test_cuda.py of commit $TORCH_COMMIT at peer-suites/torch/test_cuda.py"
fi

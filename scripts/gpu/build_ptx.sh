#!/usr/bin/env bash
# Compile the test kernels in tests/kernels to PTX. Run on the GPU machine (nvcc is there, not on the
# development machines), from the repository root; commit the .ptx files it writes.
#
#   scripts/gpu/build_ptx.sh            # sm_90 (H100)
#   ARCH=sm_80 scripts/gpu/build_ptx.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-sm_90}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "build_ptx.sh: $NVCC not found (it is on the GPU machine)" >&2; exit 1; }
"$NVCC" --version | tail -n 2
# heap_malloc.ptx is the kernel the heap tests load.
"$NVCC" -ptx -arch="$ARCH" -o tests/kernels/heap_malloc.ptx tests/kernels/heap_malloc.cu
# fill.ptx is hand-written; the compiled one beside it cross-checks it (tests/test_kernels.py launches both).
"$NVCC" -ptx -arch="$ARCH" -o tests/kernels/fill_nvcc.ptx tests/kernels/fill.cu
for f in tests/kernels/heap_malloc.ptx tests/kernels/fill_nvcc.ptx; do
    echo "$f: $(wc -c <"$f") bytes, entries: $(grep -o '\.entry [A-Za-z_0-9]*' "$f" | cut -d' ' -f2 | tr '\n' ' ')"
done

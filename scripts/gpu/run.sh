#!/usr/bin/env bash
# The whole GPU run, as one command on the GPU machine (docs/contributing/gpu-testing.md), from the repository root
# with dist/ carried over:
#
#   scripts/gpu/run.sh [pytest args...]
#
# installs the cp312 wheel without an index, prints `cudacore doctor`, runs the whole test suite on the
# real driver (the `gpu` tests included; `sim` tests skip), then the benchmarks, with their tables last.
# Logs go to $OUT (the device tool's folder) when it is set, else to ./gpu-out.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDACORE_BACKEND=cuda
# NVLink multicast stays off on the shared multi-GPU machine (docs/contributing/gpu-testing.md): every process started
# here inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

rm -rf gpu-site
"$PY" -m pip install -q --no-deps --no-index --target gpu-site dist/cudacore-*cp312*.whl || exit 1
export PYTHONPATH=$PWD/gpu-site
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

echo "== cudacore doctor"
"$PY" -m cudacore doctor 2>&1 | tee "$OUT/doctor.txt"

echo "== pytest (real driver)"
"$PY" -m pytest -q -p no:cacheprovider -rs tests "$@" 2>&1 | tee "$OUT/pytest.txt" | tail -40
status=${PIPESTATUS[0]}

echo "== benchmarks"
{
    "$PY" bench/hot_paths.py
    echo
    "$PY" bench/gil_calls.py --rounds 7 --calls 100000
    echo
    "$PY" bench/alloc.py
    for b in bench/copies.py bench/threads.py bench/multi_gpu.py bench/one_pool.py; do
        [ -f "$b" ] && { echo; "$PY" "$b"; }
    done
} 2>&1 | tee "$OUT/bench.txt"
exit "$status"

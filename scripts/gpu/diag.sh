#!/usr/bin/env bash
# Crash diagnosis on the GPU machine: the copy benchmark and four stress processes at once, each with
# Python's faulthandler and Go's full traceback, stderr kept whole in $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDACORE_BACKEND=cuda GOTRACEBACK=all
rm -rf gpu-site
"$PY" -m pip install -q --no-deps --no-index --target gpu-site dist/cudacore-*cp312*.whl || exit 1
export PYTHONPATH=$PWD/gpu-site
"$PY" -X faulthandler bench/copies.py >"$OUT/copies.out" 2>"$OUT/copies.err"; echo "copies exit $?"
for i in 1 2 3 4; do
    "$PY" -X faulthandler tests/stress.py --threads 16 --seconds 10 --seed "$i" >"$OUT/stress$i.out" 2>"$OUT/stress$i.err" &
done
wait
for i in 1 2 3 4; do echo "stress $i: $(tail -c 300 "$OUT/stress$i.out")"; head -c 1500 "$OUT/stress$i.err"; done

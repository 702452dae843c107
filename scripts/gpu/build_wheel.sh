#!/usr/bin/env bash
# Build the cp312 manylinux wheel that the GPU machine installs (it has Python 3.12 and no Go): run here, on the
# development machine, from anywhere. The wheel lands in dist/; scripts/gpu/run.sh installs it there.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -f dist/cudacore-*cp312*.whl
make wheel312
ls -la dist/*cp312*.whl

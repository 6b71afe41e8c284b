#!/usr/bin/env bash
# Configures and builds edbatch (Release) into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# EDBATCH_TORCH=OFF leaves out the PyTorch extension and its tests (docs/pytorch.md).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DEDBATCH_TORCH="${EDBATCH_TORCH:-ON}" "$@" >/dev/null
cmake --build build -j "$(nproc)"

#!/usr/bin/env bash
# On a GPU machine with PyTorch: build the PyTorch extension with the CUDA backend, run its pytest
# suite (when pytest is there), check the extension on cuda against itself on cpu
# (bench/torch_ext_cuda_check.py), and time training steps through the extension against
# node-by-node and hand-batched PyTorch on the GPU (bench/bench_torch_ext.py); the check and the
# timing run twice, with CUDA tensors kept on the GPU and copied through host memory. Logs go to the
# output folder ($OUT when set, else gpu-torch-results).
#
#   scripts/gpu_torch.sh [--out DIR] [--build DIR] [--reps N]
#
# Missing TBB, fmt or nlohmann-json: Debian packages in .deb/ are unpacked into a private prefix,
# as scripts/gpu.sh does.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-torch-results}
build=build-gpu-torch
reps=15
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_torch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
case $build in /*) ;; *) build=$root/$build ;; esac  # relative to the repository root
status=0

source scripts/gpu_deps.sh
py=$(command -v python3)
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'

if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON \
         -DEDBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_TORCH=ON \
         -DEDBATCH_PYTHON="$py" -DEDBATCH_BUILD_EXAMPLES=OFF -DEDBATCH_BUILD_BENCH=OFF &&
       ninja -C "$build" -j "$(nproc)" edbatch_torch; } > "$out/build.log" 2>&1; then
  echo "gpu_torch.sh: build failed (build.log):" >&2
  grep -E -A8 "error|FAILED|Error" "$out/build.log" | head -60 >&2
  exit 1
fi
grep "PyTorch extension" "$out/build.log" >&2
export EDBATCH_LIBRARY="$build/libedbatch_torch.so" PYTHONPATH="$root/python"

if "$py" -c 'import pytest' 2> /dev/null; then
  "$py" -m pytest -q -p no:cacheprovider tests/python > "$out/pytest.log" 2>&1 || status=1
  tail -3 "$out/pytest.log" | sed 's/^/pytest: /' >&2
else
  echo "gpu_torch.sh: no pytest here; the Python tests were not run" >&2
fi
# Both ways CUDA tensors can go: kept on the GPU (the default) and copied through host memory.
for path in device host; do
  copy=0
  [ "$path" = host ] && copy=1
  echo "== CUDA tensors: $path path (EDBATCH_TORCH_HOST_COPY=$copy)" >&2
  EDBATCH_TORCH_HOST_COPY=$copy "$py" bench/torch_ext_cuda_check.py 2>&1 |
    tee "$out/cuda_check_$path.log" || status=1
  EDBATCH_TORCH_HOST_COPY=$copy "$py" bench/bench_torch_ext.py --device cuda --reps "$reps" \
    > "$out/bench_torch_ext_$path.jsonl" 2> "$out/bench_torch_ext_$path.txt" || status=1
  cat "$out/bench_torch_ext_$path.txt" >&2
done
exit $status

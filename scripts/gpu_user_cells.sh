#!/usr/bin/env bash
# On a GPU machine with PyTorch: the user-cell benchmark (bench/bench_user_cells.py: Child-Sum
# Tree-LSTM and a lattice LSTM written as user cells, against the built-in cell, node-by-node and
# hand-batched PyTorch) on the GPU at mini-batch 32 and 128, hidden 128 and 256, and on one pinned
# CPU core (taskset, one thread for edbatch and torch; core 0 unless --core N). Builds the
# extension as scripts/gpu_torch.sh does when it is not built yet. JSON lines and tables go to the
# output folder ($OUT when set, else gpu-user-cells). Arguments after -- go to every
# bench_user_cells.py run (e.g. -- --steps-per-sync 8 --eager-reps 0).
#
#   scripts/gpu_user_cells.sh [--out DIR] [--build DIR] [--reps N] [--trees FILE] [--no-cpu]
#                             [--cpu-only] [--core N] [-- BENCH ARGS]
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-user-cells}
build=build-gpu-torch
reps=9
trees=""
cpu=1
gpu=1
core=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --trees) trees=$2; shift 2 ;;
    --no-cpu) cpu=0; shift ;;
    --cpu-only) gpu=0; shift ;;
    --core) core=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_user_cells.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
case $build in /*) ;; *) build=$root/$build ;; esac  # relative to the repository root
status=0
source scripts/gpu_deps.sh
py=$(command -v python3)
if [ ! -f "$build/libedbatch_torch.so" ]; then
  { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON \
      -DEDBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_TORCH=ON \
      -DEDBATCH_PYTHON="$py" -DEDBATCH_BUILD_EXAMPLES=OFF -DEDBATCH_BUILD_BENCH=OFF &&
    ninja -C "$build" -j "$(nproc)" edbatch_torch; } > "$out/build.log" 2>&1 ||
    { echo "gpu_user_cells.sh: build failed (build.log)" >&2; exit 1; }
fi
export EDBATCH_LIBRARY="$build/libedbatch_torch.so" PYTHONPATH="$root/python"
extra=("$@")
[ -n "$trees" ] && extra+=(--trees "$trees")
if [ "$gpu" = 1 ]; then
  for hidden in 128 256; do
    for batch in 32 128; do
      "$py" bench/bench_user_cells.py --device cuda --hidden "$hidden" --batch "$batch" \
        --reps "$reps" "${extra[@]}" >> "$out/user_cells_cuda.jsonl" \
        2>> "$out/user_cells_cuda.txt" || status=1
    done
  done
  cat "$out/user_cells_cuda.txt" >&2
fi
if [ "$cpu" = 1 ]; then
  for hidden in 128 256; do
    for batch in 32 128; do
      OMP_NUM_THREADS=1 taskset -c "$core" "$py" bench/bench_user_cells.py --device cpu \
        --threads 1 --hidden "$hidden" --batch "$batch" --reps "$reps" "${extra[@]}" \
        >> "$out/user_cells_cpu1.jsonl" 2>> "$out/user_cells_cpu1.txt" || status=1
    done
  done
  cat "$out/user_cells_cpu1.txt" >&2
fi
exit $status

#!/usr/bin/env bash
# On a GPU machine: the learned policy's time reward. Builds (Release, sm_90), then for
# lattice_lstm and lattice_gru: measures per-type costs on the GPU (forward device time of
# training mini-batches under several policies, fitted per type: launch us + us per node), trains
# a policy that minimises the predicted time (`edbatch train --device cuda`) and one that counts
# batches, and runs each policy and lb-greedy on the dev set with `edbatch run --device cuda`,
# same run length, to compare forward execution time (host time of the forward, which waits for
# the device when the loss is read). Writes logs and JSON into the output folder
# ($OUT when set, else gpu-policy-results).
#
#   scripts/gpu_policy.sh [--out DIR] [--build DIR] [--data DIR] [--iters N]
#
# --data: a folder with train.txt and dev.txt (lattice files); default ../shared/data/lattice.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-policy-results}
build=build-gpu
data="$root/../shared/data/lattice"
iters=40
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON -DEDBATCH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_TORCH=OFF -DEDBATCH_BUILD_BENCH=OFF \
  -DEDBATCH_BUILD_EXAMPLES=OFF > "$out/cmake.log"
cmake --build "$build" -j"$(nproc)" --target edbatch > "$out/build.log"
eb="$build/edbatch"
for model in lattice_lstm lattice_gru; do
  for reward in cuda none; do
    "$eb" train --model "$model" --data "$data/train.txt" --eval-data "$data/dev.txt" \
      --device "$reward" --cost-graphs 8 --cost-reps 5 -o "$out/$model.$reward.policy.json" \
      > "$out/train.$model.$reward.txt" 2> "$out/train.$model.$reward.log"
  done
  for policy in lb-greedy "fsm:$out/$model.cuda.policy.json" "fsm:$out/$model.none.policy.json"; do
    tag=$(basename "${policy#fsm:}" .policy.json)
    for round in 1 2 3; do
      "$eb" run --model "$model" --data "$data/dev.txt" --device cuda --policy "$policy" \
        --iters "$iters" --json "$out/run.$tag.$round.json" > "$out/run.$tag.$round.txt" 2>&1
    done
  done
  # --policy auto: the first run learns (at most --policy-budget seconds), the second reuses.
  for round in first second; do
    "$eb" run --model "$model" --data "$data/dev.txt" --device cuda --policy auto \
      --policy-cache "$out/auto-cache" --iters "$iters" --json "$out/run.auto.$model.$round.json" \
      > "$out/run.auto.$model.$round.txt" 2>&1
  done
done
grep -H -E "fsm |lb-greedy|lower bound|decisions|predicted" "$out"/train.*.txt > "$out/summary.txt" || true
grep -H -E "execution|total|batches per|policy table" "$out"/run.*.txt >> "$out/summary.txt" || true
cat "$out/summary.txt"

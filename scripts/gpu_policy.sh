#!/usr/bin/env bash
# On a GPU machine: the learned policy's time reward against lb-greedy, in one run. Builds
# (Release, sm_90), then for each model and mini-batch size: trains a policy on the GPU's
# measured per-type costs (`edbatch train --device cuda`, with the first --batch-us value: auto
# trains three and keeps the one it times fastest), one more per further --batch-us value on
# those same costs (`--costs`), and one that counts batches
# (`--device none`); then runs lb-greedy and every policy on the held-out dev set with
# `edbatch run --device cuda --json`, the policies alternating within each round, and prints per
# policy its batches and stages per mini-batch and the device time of a forward (mean over the
# run's mini-batches, each round) against lb-greedy's. Last, `--policy auto` twice (the first
# run learns, the second reuses the cache). Logs, policies and JSON go into the output folder
# ($OUT when set, else gpu-policy-results).
#
#   scripts/gpu_policy.sh [--out DIR] [--build DIR] [--data DIR] [--models "lattice_lstm ..."]
#       [--batches "32 128"] [--batch-us "auto 0"] [--rounds 2] [--no-count] [--no-auto]
#       [--cost-graphs 8] [--cost-reps 5]
#
# --data: a folder with train.txt (trained on) and dev.txt (only run on); default .data/lattice
# (a copy inside the checkout), else ../shared/data/lattice. Forward passes per run: 1280
# instances' worth (at least 8). --cost-graphs and --cost-reps: the cost measurement's training
# mini-batches and timed passes per policy and mini-batch (`edbatch train`'s options).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-policy-results}
build=build-gpu
data=""
models="lattice_lstm lattice_gru"
batches="32 128"
batch_us="auto 0"
rounds=2
count=1
auto=1
cost_graphs=8
cost_reps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --batch-us) batch_us=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-count) count=0; shift ;;
    --no-auto) auto=0; shift ;;
    --cost-graphs) cost_graphs=$2; shift 2 ;;
    --cost-reps) cost_reps=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$data" ]; then
  for d in "$root/.data/lattice" "$root/../shared/data/lattice"; do
    if [ -f "$d/train.txt" ] && [ -f "$d/dev.txt" ]; then data=$d; break; fi
  done
fi
if [ -z "$data" ] || [ ! -f "$data/train.txt" ] || [ ! -f "$data/dev.txt" ]; then
  echo "gpu_policy.sh: no lattice train.txt and dev.txt (put them in .data/lattice or pass --data)" >&2
  exit 2
fi
# Absolute before the cd below (scripts/gpu_deps.sh reads .deb/ from the repository root).
data=$(cd "$data" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
source scripts/gpu_deps.sh
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON -DEDBATCH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_TORCH=OFF -DEDBATCH_BUILD_BENCH=OFF \
  -DEDBATCH_BUILD_TESTS=OFF -DEDBATCH_BUILD_EXAMPLES=OFF > "$out/cmake.log"
cmake --build "$build" -j"$(nproc)" --target edbatch > "$out/build.log"
eb="$build/edbatch"
threads=$(nproc)
for model in $models; do
  for b in $batches; do
    tag="$model.$b"
    train=("$eb" train --model "$model" --data "$data/train.txt" --batch "$b" --threads "$threads")
    policies=(lb-greedy)
    first=""
    for us in $batch_us; do
      file="$out/$tag.us$us.policy.json"
      if [ -z "$first" ]; then
        "${train[@]}" --device cuda --cost-graphs "$cost_graphs" --cost-reps "$cost_reps" --batch-us "$us" -o "$file" \
          > "$out/train.$tag.us$us.txt" 2> "$out/train.$tag.us$us.log"
        first=$file
      else
        "${train[@]}" --costs "$first" --batch-us "$us" -o "$file" \
          > "$out/train.$tag.us$us.txt" 2> "$out/train.$tag.us$us.log"
      fi
      policies+=("fsm:$file")
    done
    if [ "$count" = 1 ]; then
      "${train[@]}" --device none -o "$out/$tag.count.policy.json" \
        > "$out/train.$tag.count.txt" 2> "$out/train.$tag.count.log"
      policies+=("fsm:$out/$tag.count.policy.json")
    fi
    iters=$(( 1280 / b > 8 ? 1280 / b : 8 ))
    for round in $(seq 1 "$rounds"); do
      for policy in "${policies[@]}"; do
        name=$(basename "${policy#fsm:}" .policy.json)
        name=${name#"$tag".}  # lb-greedy, us0.25, count, ...
        "$eb" run --model "$model" --data "$data/dev.txt" --device cuda --policy "$policy" \
          --batch "$b" --iters "$iters" --json "$out/run.$tag.$name.$round.json" \
          > "$out/run.$tag.$name.$round.txt" 2>&1
      done
    done
  done
  if [ "$auto" = 1 ]; then
    for round in first second; do
      "$eb" run --model "$model" --data "$data/dev.txt" --device cuda --policy auto \
        --policy-cache "$out/auto-cache" --json "$out/run.auto.$model.$round.json" \
        > "$out/run.auto.$model.$round.txt" 2>&1
    done
  fi
done
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, re, sys
from collections import defaultdict
out = sys.argv[1]
runs = defaultdict(list)  # (model, batch, policy) -> [run json per round]
for f in sorted(glob.glob(os.path.join(out, "run.*.*.*.*.json"))):
    m = re.match(r"run\.(\w+)\.(\d+)\.(.+)\.(\d+)\.json$", os.path.basename(f))
    if m:
        runs[(m[1], int(m[2]), m[3])].append(json.load(open(f)))
print("model B policy: batches, stages, device ms of a forward per round (mean), vs lb-greedy")
for model, b in sorted({(k[0], k[1]) for k in runs}):
    def dev(p):
        return [r["device_forward_ms"]["mean"] for r in runs[(model, b, p)]]
    base = dev("lb-greedy") if (model, b, "lb-greedy") in runs else []
    for (mm, bb, p), rs in sorted(runs.items()):
        if (mm, bb) != (model, b):
            continue
        d = dev(p)
        vs = f"{100 * (sum(d) / sum(base) - 1):+.1f}%" if base and p != "lb-greedy" else ""
        print(f"{model} {b} {p}: {rs[0]['batches_per_minibatch']['mean']:.1f} batches, "
              f"{rs[0]['stages_per_minibatch']['mean']:.1f} stages, "
              f"{' / '.join(f'{x:.4f}' for x in d)} ms {vs}")
for f in sorted(glob.glob(os.path.join(out, "train.*.txt"))):
    for line in open(f):
        if re.match(r"(fsm|lb-greedy|decisions)", line):
            print(os.path.basename(f), line.rstrip())
EOF

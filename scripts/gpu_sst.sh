#!/usr/bin/env bash
# On the GPU machine: time to accuracy of the Tree-LSTM on SST, edbatch against hand-batched
# PyTorch (bench/torch_sst.py) training the same model with the same optimizer (Adam, lr 0.001,
# clip 5, mini-batch 32, hidden 128, full vocabulary) from the same initial weights (edbatch's,
# saved once), on one pinned CPU core (taskset, one thread each) and on the GPU. Each run trains
# on train.txt and evaluates dev.txt after every epoch; the table gives per implementation and
# device the training time (evaluation excluded) to the first epoch at --target root accuracy
# (median and range over --reps runs), that epoch, the best root accuracy and the median epoch.
# Logs and JSON go to the output folder ($OUT when set, else gpu-sst-results); summary.txt holds
# the table.
#
#   scripts/gpu_sst.sh [--out DIR] [--build DIR] [--data DIR] [--epochs N] [--reps N]
#                      [--target ACC] [--core C]
#
# --data: a folder with the SST train.txt and dev.txt; default .data/trees (what travels with the
# checkout), else ../shared/data/trees.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-sst-results}
build=build-gpu-sst
data=
epochs=8
reps=2
target=0.45
core=2
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --core) core=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_sst.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$data" ]; then
  for d in "$root/.data/trees" "$root/../shared/data/trees"; do
    if [ -f "$d/train.txt" ] && [ -f "$d/dev.txt" ]; then data=$d; break; fi
  done
fi
if [ -z "$data" ] || [ ! -f "$data/train.txt" ] || [ ! -f "$data/dev.txt" ]; then
  echo "gpu_sst.sh: no SST train.txt and dev.txt (put them in .data/trees or pass --data)" >&2
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
status=0

source scripts/gpu_deps.sh
py=$(command -v python3)
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' |
  tee "$out/torch.txt"

if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON \
         -DEDBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_TORCH=OFF \
         -DEDBATCH_BUILD_EXAMPLES=OFF -DEDBATCH_BUILD_BENCH=OFF -DEDBATCH_BUILD_TESTS=OFF &&
       ninja -C "$build" -j "$(nproc)" edbatch_cli; } > "$out/build.log" 2>&1; then
  echo "gpu_sst.sh: build failed (build.log):" >&2
  grep -E -A8 "error|FAILED|Error" "$out/build.log" | head -60 >&2
  exit 1
fi
eb="$build/edbatch"
common=(--model tree_lstm --data "$data/train.txt" --eval "$data/dev.txt" --vocab-size 0)
# The initial weights every run starts from (untrained: no --train).
"$eb" run "${common[@]}" --iters 1 --save-weights "$out/init.safetensors" > "$out/init.log" 2>&1 ||
  { echo "gpu_sst.sh: could not save the initial weights (init.log)" >&2; exit 1; }

run() {  # name, command...
  local name=$1
  shift
  echo "== $name" >&2
  "$@" > "$out/$name.log" 2>&1 || { status=1; tail -5 "$out/$name.log" >&2; }
}
train=(run "${common[@]}" --train --epochs "$epochs" --optimizer adam --load-weights
       "$out/init.safetensors")
torch_sst=(bench/torch_sst.py --train "$data/train.txt" --dev "$data/dev.txt" --epochs "$epochs"
           --target "$target" --weights "$out/init.safetensors")
for rep in $(seq 1 "$reps"); do
  run "edbatch_cpu.$rep" taskset -c "$core" "$eb" "${train[@]}" --threads 1 \
    --json "$out/edbatch_cpu.$rep.json"
  run "edbatch_cuda.$rep" "$eb" "${train[@]}" --device cuda --json "$out/edbatch_cuda.$rep.json"
  run "torch_cpu.$rep" taskset -c "$core" "$py" "${torch_sst[@]}" --device cpu --threads 1
  run "torch_cuda.$rep" "$py" "${torch_sst[@]}" --device cuda
done

"$py" - "$out" "$target" <<'EOF' | tee "$out/summary.txt"
import glob, json, os, statistics, sys
out, target = sys.argv[1], float(sys.argv[2])
runs = {}  # (impl, device) -> [(time to target, its epoch, best accuracy, epoch seconds)]
for path in sorted(glob.glob(os.path.join(out, "edbatch_*.json"))):
    device = os.path.basename(path).split(".")[0].split("_")[1]
    epochs = [e for e in json.load(open(path))["epochs"] if e.get("epoch", 0) > 0]
    hit = next((e for e in epochs if e["eval"]["root_accuracy"] >= target), None)
    walls = [0.0] + [e["train_wall_s"] for e in epochs]
    runs.setdefault(("edbatch", device), []).append((
        hit["train_wall_s"] if hit else None, hit["epoch"] if hit else None,
        max(e["eval"]["root_accuracy"] for e in epochs),
        statistics.median(b - a for a, b in zip(walls, walls[1:]))))
for path in sorted(glob.glob(os.path.join(out, "torch_*.log"))):
    lines = [json.loads(l) for l in open(path) if l.startswith("{")]
    epochs = [l for l in lines if l.get("epoch", 0) > 0]
    summary = next((l for l in lines if l.get("summary")), None)
    if not summary:
        continue
    runs.setdefault(("pytorch", summary["device"]), []).append((
        summary["time_to_target_s"], summary["target_epoch"], summary["best_root_accuracy"],
        summary["epoch_s"]["median"]))
print(f"time to {100 * target:.0f}% dev root accuracy (training time, evaluation excluded)")
print("| implementation | device | time to target, s: median (range) | at epoch | best root acc "
      "| epoch, s (median) | runs |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for (impl, device), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    times = sorted(r[0] for r in rs if r[0] is not None)
    t = (f"{statistics.median(times):.2f} ({times[0]:.2f}-{times[-1]:.2f})" if times
         else "not reached")
    at = sorted({r[1] for r in rs if r[1] is not None})
    print(f"| {impl} | {device} | {t} | {','.join(map(str, at)) or '-'} | "
          f"{100 * max(r[2] for r in rs):.2f}% | {statistics.median(r[3] for r in rs):.2f} | "
          f"{len(rs)} |")
EOF
exit $status

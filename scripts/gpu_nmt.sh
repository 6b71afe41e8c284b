#!/usr/bin/env bash
# On the GPU machine: lstm_nmt's greedy decoding and teacher-forced training, edbatch against
# PyTorch as its users write it (bench/torch_nmt.py), hidden 128 and 256, mini-batches of 32 and
# 128: on one pinned CPU core (taskset -c 0, one thread each) and on the GPU. Also runs the CUDA
# tests of incremental forward. Logs and JSON lines go to the output folder ($OUT when set, else
# gpu-nmt-results); summary.txt puts the same-run ratios side by side.
#
#   scripts/gpu_nmt.sh [--out DIR] [--build DIR] [--reps N] [--vocab V]
#
# --vocab: the target vocabulary (default 256, the benchmark's; IWSLT'15's Vietnamese one has
# 7,709 words), for both sides.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-nmt-results}
build=build-gpu-nmt
reps=10
vocab=256
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_nmt.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
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
         -DEDBATCH_BUILD_EXAMPLES=OFF -DEDBATCH_BUILD_BENCH=ON &&
       ninja -C "$build" -j "$(nproc)" bench_nmt edbatch_tests; } > "$out/build.log" 2>&1; then
  echo "gpu_nmt.sh: build failed (build.log):" >&2
  grep -E -A8 "error|FAILED|Error" "$out/build.log" | head -60 >&2
  exit 1
fi

"$build/edbatch_tests" -tc='cuda: incremental*,cuda: every zoo model*' > "$out/cuda_tests.log" 2>&1 ||
  status=1
tail -3 "$out/cuda_tests.log" >&2

run() {  # name, command...
  local name=$1
  shift
  echo "== $name" >&2
  "$@" > "$out/$name.log" 2>&1 || { status=1; tail -5 "$out/$name.log" >&2; }
  grep -v '^{' "$out/$name.log" >&2
}
run edbatch_cpu taskset -c 0 "$build/bench_nmt" --device cpu --reps "$reps" --vocab "$vocab"
run torch_cpu taskset -c 0 "$py" bench/torch_nmt.py --device cpu --threads 1 --reps "$reps" \
  --vocab "$vocab"
run edbatch_cuda "$build/bench_nmt" --device cuda --reps "$reps" --vocab "$vocab"
run torch_cuda "$py" bench/torch_nmt.py --device cuda --reps "$reps" --vocab "$vocab"
"$py" bench/torch_nmt.py --device cuda --check >> "$out/torch_cuda.log" 2>&1 || status=1

# Same-run ratios: edbatch per_s / PyTorch per_s for each (device, mode, hidden, batch).
cat "$out"/edbatch_*.log "$out"/torch_*.log | grep '^{' | "$py" -c '
import json, sys
rows = {}
for line in sys.stdin:
    r = json.loads(line)
    rows[(r["impl"], r["device"], r["mode"], r["hidden"], r["batch"])] = r
for (impl, dev, mode, h, b), r in sorted(rows.items()):
    if impl != "edbatch":
        continue
    t = rows.get(("pytorch", dev, mode, h, b))
    ratio = r["per_s_median"] / t["per_s_median"] if t else float("nan")
    host = r.get("host_us_per_step_median")
    ours, theirs = r["per_s_median"], t["per_s_median"] if t else float("nan")
    print(f"{dev:5s} {mode:6s} hidden {h:4d} B {b:4d}  edbatch {ours:9.1f}/s  "
          f"pytorch {theirs:9.1f}/s  ratio {ratio:5.2f}" +
          (f"  host/step {host:.1f} us" if host is not None else ""))
' | tee "$out/summary.txt"
exit $status

#!/usr/bin/env bash
# edbatch against the PyTorch baselines (bench/torch_baseline.py), side by side on the same data
# and weights: tree_lstm and lattice_lstm, mini-batch 32, hidden 128 (or the lists given: every
# mini-batch size for every hidden size), forward and forward+backward, for each thread count. The checks run first (per-instance losses, and the
# weights after one training step) and stop the script on a mismatch. Rounds interleave edbatch, batched PyTorch and eager PyTorch so that machine noise hits
# them alike; the summary gives medians over rounds, their range, and the ratios.
#
#   scripts/bench_torch.sh [--edbatch BIN] [--device cpu|cuda] [--out DIR] [--threads "1 2"]
#                          [--instances N] [--iters N] [--eager-iters N] [--rounds N]
#                          [--models "tree_lstm lattice_lstm"] [--python PY]
#                          [--batch "8 32 128"] [--hidden "64 128"]
# scripts/report.py throughput OUT/results.jsonl -o chart.png draws the results.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
edbatch=""
device=cpu
out=bench-torch-out
threads=""
instances=1000
iters=20
eager_iters=5
rounds=3
models="tree_lstm lattice_lstm"
batches=32
hiddens=128
python=""
seed=1

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --edbatch) edbatch=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --instances) instances=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --eager-iters) eager_iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --batch) batches=$2; shift 2 ;;
    --hidden) hiddens=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "bench_torch.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
[ -n "$threads" ] || { [ "$device" = cpu ] && threads="1 2" || threads="1"; }

# The edbatch binary: given, or the first build folder that has one.
if [ -z "$edbatch" ]; then
  for b in build build-native build-base; do
    if [ -x "$root/$b/edbatch" ]; then edbatch="$root/$b/edbatch"; break; fi
  done
fi
[ -n "$edbatch" ] && [ -x "$edbatch" ] || { echo "bench_torch.sh: no edbatch binary (--edbatch)" >&2; exit 2; }

# A Python that has torch: given, Debian's, or the one on PATH.
if [ -z "$python" ]; then
  for p in /usr/bin/python3 python3 python; do
    if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then python=$p; break; fi
  done
fi
[ -n "$python" ] || { echo "bench_torch.sh: no Python with torch found (--python)" >&2; exit 2; }

mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
baseline=("$python" "$root/bench/torch_baseline.py")
echo "edbatch: $edbatch; python: $python (torch $("$python" -c 'import torch; print(torch.__version__)')); device $device; threads $threads; out $out" >&2

for model in $models; do
for hidden in $hiddens; do
  data="$out/$model.data.txt"
  weights="$out/$model.h$hidden.weights.safetensors"
  outputs="$out/$model.h$hidden.outputs.jsonl"
  common=(--model "$model" --hidden "$hidden" --seed "$seed")
  "$edbatch" run "${common[@]}" --data "synthetic:$instances" --write-data "$data"
  # Weights as initialised for this seed (a forward-only run leaves them unchanged) and the
  # per-instance losses of one forward pass over the data.
  "$edbatch" run "${common[@]}" --batch 32 --data "$data" --device "$device" --iters 1 --warmup 0 \
    --outputs "$outputs" --save-weights "$weights" > /dev/null
  "${baseline[@]}" --model "$model" --data "$data" --weights "$weights" --device "$device" \
    --hidden "$hidden" --check-against "$outputs" --check-only --impl both | tee -a "$results"
  # Gradients: one SGD step on 32 other instances as one mini-batch, from the same weights.
  step_data="$out/$model.step.data.txt"
  step_weights="$out/$model.step.safetensors"
  "$edbatch" run --model "$model" --hidden "$hidden" --seed $((seed + 1)) --data synthetic:32 \
    --write-data "$step_data"
  "$edbatch" run --model "$model" --hidden "$hidden" --batch 32 --data "$step_data" --device "$device" \
    --load-weights "$weights" --train --clip 0 --iters 1 --warmup 0 --save-weights "$step_weights" > /dev/null
  "${baseline[@]}" --model "$model" --data "$step_data" --weights "$weights" --device "$device" \
    --hidden "$hidden" --check-train-step "$step_weights" --impl both | tee -a "$results"

  for t in $threads; do
    for mode in forward train; do
      train=(); [ "$mode" = train ] && train=(--train)
      for batch in $batches; do
      for r in $(seq 1 "$rounds"); do
        # edbatch plain (each loss read before the next mini-batch is built) and pipelined;
        # training is plain SGD without clipping, as the baseline trains.
        for impl in edbatch edbatch_pipelined; do
          pipe=(); [ "$impl" = edbatch_pipelined ] && pipe=(--pipeline)
          json="$out/$model.$impl.$mode.t$t.b$batch.h$hidden.r$r.json"
          "$edbatch" run "${common[@]}" --batch "$batch" --data "$data" --load-weights "$weights" \
            --device "$device" --threads "$t" --iters "$iters" ${train[@]+"${train[@]}" --clip 0} \
            ${pipe[@]+"${pipe[@]}"} --json "$json" > /dev/null
          "$python" -c 'import json,sys; j=json.load(open(sys.argv[1])); j["impl"]=sys.argv[3]; j["round"]=int(sys.argv[2]); print(json.dumps(j))' \
            "$json" "$r" "$impl" >> "$results"
        done
        # Batched, then eager, in one process (one torch import and device start per round).
        "${baseline[@]}" --model "$model" --data "$data" --weights "$weights" \
          --batch "$batch" --hidden "$hidden" --device "$device" --threads "$t" --impl both --iters "$iters" \
          --eager-iters "$eager_iters" ${train[@]+"${train[@]}"} |
          "$python" -c 'import json,sys
for line in sys.stdin:
    j = json.loads(line); j["round"] = int(sys.argv[1]); print(json.dumps(j))' "$r" >> "$results"
        echo "  $model $mode x$t mini-batch $batch hidden $hidden round $r done" >&2
      done
      done
    done
  done
done
done

"$python" - "$results" "$out/summary.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for r in rows:
    if "check" in r:
        continue
    key = (r["model"], "train" if r["train"] else "forward", r["threads"], r["batch"], r["hidden"])
    runs.setdefault(key, {}).setdefault(r["impl"], []).append(r)

def med(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

# Ratios of throughput medians over rounds, and of the p10 time per mini-batch (median over
# rounds), which load from other processes on the machine disturbs least.
lines = ["| model | mode | threads | batch | hidden | impl | instances/s median (min-max over rounds) | "
         "ms/mini-batch median (p10-p90, median round) | edbatch / impl | same, by p10 ms | "
         "edbatch pipelined / impl |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for key in sorted(runs):
    impls = runs[key]
    ed = med([r["instances_per_s"] for r in impls["edbatch"]]) if "edbatch" in impls else None
    ed_p10 = (med([r["ms_per_minibatch"]["p10"] for r in impls["edbatch"]])
              if "edbatch" in impls else None)
    pipe = (med([r["instances_per_s"] for r in impls["edbatch_pipelined"]])
            if "edbatch_pipelined" in impls else None)
    for impl in ("edbatch", "edbatch_pipelined", "torch_batched", "torch_eager"):
        rs = impls.get(impl)
        if not rs:
            continue
        ips = [r["instances_per_s"] for r in rs]
        mid = sorted(rs, key=lambda r: r["instances_per_s"])[len(rs) // 2]["ms_per_minibatch"]
        ratio = f"{ed / med(ips):.2f}x" if ed and not impl.startswith("edbatch") else ""
        ratio_pipe = f"{pipe / med(ips):.2f}x" if pipe and not impl.startswith("edbatch") else ""
        p10 = med([r["ms_per_minibatch"]["p10"] for r in rs])
        ratio_p10 = f"{p10 / ed_p10:.2f}x" if ed_p10 and not impl.startswith("edbatch") else ""
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {impl} | {med(ips):,.0f} "
                     f"({min(ips):,.0f}-{max(ips):,.0f}) | {mid['median']:.2f} "
                     f"({mid['p10']:.2f}-{mid['p90']:.2f}) | {ratio} | {ratio_p10} | "
                     f"{ratio_pipe} |")
checks = [r for r in rows if "check" in r]
lines.append("")
for c in checks:
    if c.get("kind") == "train_step":
        lines.append(f"train-step check {c['model']} {c['impl']} ({c['device']}): {c['check']}, "
                     f"{c['instances']} instances, max abs diff of the weights "
                     f"{c['max_abs_diff']:.3g}, largest update {c['largest_update']:.3g}")
    else:
        lines.append(f"loss check {c['model']} {c['impl']} ({c['device']}): {c['check']}, "
                     f"{c['instances']} instances, max abs diff {c['max_abs_diff']:.3g}, "
                     f"max rel diff {c['max_rel_diff']:.3g}")
text = "\n".join(lines) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
EOF
echo "results: $results, summary: $out/summary.md" >&2

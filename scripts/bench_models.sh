#!/usr/bin/env bash
# Runs every model of the zoo but lstm_nmt (--models picks others) at mini-batch 32, hidden 128 on
# the CPU under each policy with 1 and 2 threads, collects the `edbatch run --json` metrics into
# one JSON-lines file and writes a markdown table next to it (scripts/bench_table.py).
#
#   scripts/bench_models.sh [--bin build/edbatch] [--out bench-out] [--blocks off|on|both]
#                           [--models "tree_lstm ..."] [--policies "none depth agenda lb-greedy"]
#                           [--threads "1 2"] [--data synthetic:640] [--iters 20] [--warmup 3]
#                           [--train]
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # before the cd: $0 may be relative
cd "$(dirname "$self")/.."

bin=build/edbatch
out=bench-out
blocks=off
models="tree_lstm tree_gru double_typed_tree_lstm mvrnn lattice_lstm lattice_gru bilstm_tagger random_dag"
policies="none depth agenda lb-greedy"
threads="1 2"
data=synthetic:640
iters=20
warmup=3
train=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --blocks) blocks=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --train) train=--train; shift ;;
    -h|--help) sed -n '2,9p' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_models.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$blocks" in
  off) block_flags=("--no-blocks") ;;
  on) block_flags=("") ;;
  both) block_flags=("--no-blocks" "") ;;
  *) echo "bench_models.sh: --blocks must be off, on or both" >&2; exit 2 ;;
esac
[[ -x "$bin" ]] || { echo "bench_models.sh: no executable '$bin' (build first, or --bin)" >&2; exit 2; }

mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for model in $models; do
  for bf in "${block_flags[@]}"; do
    for policy in $policies; do
      for t in $threads; do
        label="$model ${bf:-(blocks)} $policy x$t"
        # shellcheck disable=SC2086
        if "$bin" run --model "$model" --batch 32 --hidden 128 --device cpu --policy "$policy" \
            --threads "$t" --data "$data" --iters "$iters" --warmup "$warmup" $bf $train \
            --json "$tmp" > /dev/null 2> "$tmp.err"; then
          python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$tmp" \
            >> "$results"
          echo "ok      $label" >&2
        else
          python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "policy": sys.argv[2],
            "threads": int(sys.argv[3]), "blocks": sys.argv[4] == "", "error": open(sys.argv[5]).read().strip()}))' \
            "$model" "$policy" "$t" "$bf" "$tmp.err" >> "$results"
          echo "FAILED  $label: $(head -c 200 "$tmp.err")" >&2
        fi
      done
    done
  done
done
rm -f "$tmp.err"
python3 scripts/bench_table.py "$results" > "$out/table.md"
cat "$out/table.md"
echo "wrote $results and $out/table.md" >&2

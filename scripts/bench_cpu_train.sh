#!/usr/bin/env bash
# CPU training and forward throughput of tree_lstm and lattice_lstm (`edbatch run`), one and two
# threads pinned with taskset, in rounds that alternate the builds so machine noise hits them
# alike; optionally against a second source tree (--baseline DIR, e.g. an older checkout) built
# the same way. JSON lines (one per run, `edbatch run --json` plus the build and round) go to
# OUT/cpu_train.jsonl; a table of medians over the rounds, with the spread, to stderr.
#
#   scripts/bench_cpu_train.sh [--out DIR] [--baseline DIR] [--rounds N] [--iters N]
#                              [--trees FILE] [--lattices FILE] [--cores "2 3"]
#                              [--models "tree_lstm lattice_lstm"] [--threads "1 2"]
#                              [--modes "train forward"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-cpu-train}
baseline=""
rounds=3
iters=200
trees=synthetic:2000
lattices=synthetic:500
cores="2 3"
models="tree_lstm lattice_lstm"
thread_counts="1 2"
modes="train forward"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --baseline) baseline=$(cd "$2" && pwd); shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --trees) trees=$2; shift 2 ;;
    --lattices) lattices=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --threads) thread_counts=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_cpu_train.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
source scripts/bench_builds.sh
bench_builds build-cpu-bench
read -r -a core_list <<< "$cores"
one=${core_list[0]}
two=$(IFS=,; echo "${core_list[*]:0:2}")
: > "$out/cpu_train.jsonl"
for round in $(seq 1 "$rounds"); do
  for model in $models; do
    data=$trees
    [ "$model" = lattice_lstm ] && data=$lattices
    for threads in $thread_counts; do
      pin=$one
      [ "$threads" = 2 ] && pin=$two
      for mode in $modes; do
        for b in "${builds[@]}"; do
          flags=()
          [ "$mode" = train ] && flags+=(--train --lr 0.01)
          taskset -c "$pin" "$b/build-cpu-bench/edbatch" run --model "$model" --data "$data" \
            --threads "$threads" --iters "$iters" --warmup 5 "${flags[@]}" \
            --json "$out/run.json" > /dev/null
          python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(build=sys.argv[2], round=int(sys.argv[3]), mode=sys.argv[4]); print(json.dumps(d))" \
            "$out/run.json" "$([ "$b" = "$root" ] && echo ours || echo baseline)" "$round" "$mode" \
            >> "$out/cpu_train.jsonl"
        done
      done
    done
  done
done
python3 - "$out/cpu_train.jsonl" <<'PY' >&2
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["model"], r["threads"], r["mode"]) for r in rows})
# exec / bwd: the median over rounds of each run's median per mini-batch, and the best round's.
print(f"{'model':<13} {'thr':>3} {'mode':<8} {'build':<9} {'inst/s median':>13} {'min-max':>17} "
      f"{'exec ms':>8} {'best':>6} {'bwd ms':>8} {'best':>6}")
for k in keys:
    for build in ("ours", "baseline"):
        rs = [r for r in rows if (r["model"], r["threads"], r["mode"]) == k and r["build"] == build]
        if not rs:
            continue
        ips = [r["instances_per_s"] for r in rs]
        ex = [r["execution_ms"]["median"] for r in rs]
        bw = [r["backward_ms"]["median"] for r in rs]
        print(f"{k[0]:<13} {k[1]:>3} {k[2]:<8} {build:<9} {statistics.median(ips):>13.0f} "
              f"{min(ips):>8.0f}-{max(ips):<8.0f} {statistics.median(ex):>8.3f} {min(ex):>6.3f} "
              f"{statistics.median(bw):>8.3f} {min(bw):>6.3f}")
PY

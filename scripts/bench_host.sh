#!/usr/bin/env bash
# Host work per node: construction and scheduling + planning of `edbatch run --device null` (no
# math, so nothing else is timed), in nanoseconds per scheduled node, for tree_lstm and
# lattice_lstm at mini-batches of 32 and 128, in two cases: new structures (training order,
# reshuffled every epoch, so no mini-batch repeats) and repeated structures (a small data set
# cycled in order, so plans are reused), each with plan reuse on and off (--plan-cache 0), and
# with plan reuse on also built in bulk (--packed, PackedGraph) instead of per node.
# Rounds alternate the builds (and, with --baseline DIR, an older source tree built the same
# way), pinned to one core. JSON lines to OUT/host.jsonl, a table of medians over the rounds
# with min-max to stderr.
#
#   scripts/bench_host.sh [--out DIR] [--baseline DIR] [--rounds N] [--iters N] [--core N]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-host-bench}
baseline=""
rounds=3
iters=200
core=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --baseline) baseline=$(cd "$2" && pwd); shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --core) core=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_host.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
source scripts/bench_builds.sh
bench_builds build-host-bench
: > "$out/host.jsonl"
for round in $(seq 1 "$rounds"); do
  for model in tree_lstm lattice_lstm; do
    for batch in 32 128; do
      for case in new repeated; do
        for cache in 64 0; do
          for b in "${builds[@]}"; do
          for mode in per-node packed; do
            # Repeated: 8 mini-batches cycled in order. New: training order, reshuffled.
            if [ "$case" = repeated ]; then
              flags=(--data "synthetic:$((batch * 8))")
            else
              flags=(--data synthetic:4000 --train)
            fi
            # The baseline may predate --plan-cache: it runs without the flag (no reuse).
            [ "$b" = "$root" ] && flags+=(--plan-cache "$cache")
            [ "$b" != "$root" ] && [ "$cache" != 0 ] && continue
            if [ "$mode" = packed ]; then
              { [ "$b" != "$root" ] || [ "$cache" = 0 ]; } && continue
              flags+=(--packed)
            fi
            taskset -c "$core" "$b/build-host-bench/edbatch" run --model "$model" --device null \
              --batch "$batch" --iters "$iters" --warmup 20 "${flags[@]}" \
              --json "$out/run.json" > /dev/null 2>> "$out/errors.log"
            python3 - "$out/run.json" "$b" "$root" "$round" "$case" "$cache" "$mode" >> "$out/host.jsonl" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
nodes = j["nodes_per_minibatch"]["median"]
print(json.dumps({
    "build": ("ours" if sys.argv[7] == "per-node" else "ours/packed") if sys.argv[2] == sys.argv[3]
             else "baseline", "round": int(sys.argv[4]),
    "model": j["model"], "batch": j["batch"], "case": sys.argv[5],
    "plan_cache_mb": int(sys.argv[6]) if sys.argv[2] == sys.argv[3] else 0,
    "nodes": nodes, "plans_reused": j.get("plans_reused", 0), "minibatches": j["minibatches"],
    "construction_ns_per_node": j["construction_ms"]["median"] * 1e6 / nodes,
    "scheduling_ns_per_node": j["scheduling_ms"]["median"] * 1e6 / nodes}))
EOF
          done
          done
        done
      done
    done
  done
done
python3 - "$out/host.jsonl" >&2 <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["model"], r["batch"], r["case"], r["build"], r["plan_cache_mb"]) for r in rows},
              key=lambda k: (k[0], k[1], k[2], ["ours", "ours/packed", "baseline"].index(k[3]), -k[4]))
def fmt(v):
    return f"{statistics.median(v):6.0f} ({min(v):.0f}-{max(v):.0f})"
print(f"{'model':13} {'B':>4} {'case':9} {'build':9} {'cache':>5} {'nodes':>6} {'reused':>7} "
      f"{'construction ns/node':>22} {'scheduling ns/node':>20} {'total':>6}")
for k in keys:
    rs = [r for r in rows if (r["model"], r["batch"], r["case"], r["build"], r["plan_cache_mb"]) == k]
    c = [r["construction_ns_per_node"] for r in rs]
    s = [r["scheduling_ns_per_node"] for r in rs]
    t = [a + b for a, b in zip(c, s)]
    print(f"{k[0]:13} {k[1]:4} {k[2]:9} {k[3]:9} {k[4]:5} {rs[0]['nodes']:6.0f} "
          f"{rs[0]['plans_reused']:3}/{rs[0]['minibatches']:<3} {fmt(c):>22} {fmt(s):>20} "
          f"{statistics.median(t):6.0f}")
EOF

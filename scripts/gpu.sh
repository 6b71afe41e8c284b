#!/usr/bin/env bash
# On a GPU machine, in one go: build (Release, native vector units, sm_90), run the CUDA tests
# and the CPU tests, run `edbatch run --device cuda` for every zoo model (op by op and through
# blocks, forward and --train), benchmark every zoo model on the GPU (mini-batch 32 and 128, hidden 128 and
# 512, forward and forward+backward: instances/s, device time against end-to-end time, kernels
# per mini-batch), and run the PyTorch baseline side by side (scripts/bench_torch.sh, when
# bench/torch_baseline.py exists). Writes logs, JSON lines and a markdown summary into the
# output folder ($OUT when set, else gpu-results).
#
#   scripts/gpu.sh [--out DIR] [--build DIR] [--models "a,b"] [--iters N] [--rounds N]
#                  [--no-tests] [--no-torch] [--sanitize [SECONDS]] [--racecheck-each SECONDS]
#                  [--racecheck-skip N] [--no-bench]
#
# --sanitize: the CUDA tests under compute-sanitizer too: memcheck over every CUDA test case,
# racecheck and synccheck over the op harness and the block of column reductions (the kernels
# with shared memory and barriers); each tool's report in sanitize_<tool>.log, at most SECONDS
# (default 900) each.
# --racecheck-each: racecheck over every CUDA test case, one case per process, in the order listed,
# for at most SECONDS in all (a line per case: its result and time; the rest listed as not run);
# --racecheck-skip N starts at the case after the first N (to go on where a budget ran out).
#
# Missing TBB, fmt or nlohmann-json: Debian packages in .deb/ (apt-get download libtbb-dev
# libtbb12 libtbbmalloc2 libtbbbind-2-5 libfmt-dev libfmt9 nlohmann-json3-dev) are unpacked into a
# private prefix and used from there.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-gpu-results}
build=build-gpu
models=""
iters=20
rounds=3
tests=1
torch=1
sanitize=0
racecheck_each=0
racecheck_skip=0
bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-tests) tests=0; shift ;;
    --no-torch) torch=0; shift ;;
    --no-bench) bench=0; torch=0; shift ;;
    --sanitize)
      sanitize=900; shift
      if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then sanitize=$1; shift; fi ;;
    --racecheck-each) racecheck_each=$2; shift 2 ;;
    --racecheck-skip) racecheck_skip=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
work=$(mktemp -d /tmp/edbatch-gpu.XXXXXX)
status=0

# ---- dependencies ----
source scripts/gpu_deps.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$work/gpu.txt"

# ---- build ----
jobs=$(nproc)
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEDBATCH_NATIVE=ON \
         -DEDBATCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEDBATCH_BUILD_EXAMPLES=OFF \
         -DEDBATCH_TORCH=OFF &&
       ninja -C "$build" -j "$jobs" edbatch_tests edbatch_cli bench_cuda; } > "$out/build.log" 2>&1; then
  echo "gpu.sh: build failed (build.log):" >&2
  grep -E -A8 "error|FAILED" "$out/build.log" | head -60 >&2
  exit 1
fi
echo "gpu.sh: built in $build" >&2

# ---- tests ----
if [ "$tests" = 1 ]; then
  "$build/edbatch_tests" -tc='cuda*' > "$out/tests_cuda.log" 2>&1 || status=1
  tail -3 "$out/tests_cuda.log" | sed 's/^/cuda tests: /' >&2
  "$build/edbatch_tests" -tce='cuda*' > "$out/tests_cpu.log" 2>&1 || status=1
  tail -3 "$out/tests_cpu.log" | sed 's/^/cpu tests: /' >&2
fi
if [ "$sanitize" != 0 ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck synccheck; do
    cases='cuda*'
    [ "$tool" != memcheck ] && cases='cuda: every op*,cuda: a block of pooling*'
    if timeout "$sanitize" "$cs" --tool "$tool" --error-exitcode 3 \
         "$build/edbatch_tests" -tc="$cases" > "$out/sanitize_$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: $(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]* (error|hazard)[s]*( displayed)?' \
        "$out/sanitize_$tool.log" | tail -1)" >&2
    else
      status=1
      echo "compute-sanitizer $tool: failed or timed out (sanitize_$tool.log):" >&2
      grep -E "ERROR SUMMARY|=========" "$out/sanitize_$tool.log" | head -20 >&2
    fi
  done
fi
if [ "$racecheck_each" != 0 ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  deadline=$(( $(date +%s) + racecheck_each ))
  "$build/edbatch_tests" --list-test-cases -tc='cuda*' | grep '^cuda' |
    tail -n +"$(( racecheck_skip + 1 ))" > "$work/cases.txt"
  : > "$out/racecheck_each.log"
  while read -r c; do
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 5 ]; then echo "racecheck: not run (time): $c" >&2; continue; fi
    pattern=$(printf '%s' "$c" | sed 's/[][*?,]/?/g')  # doctest's filters treat , as a separator
    start=$(date +%s)
    timeout "$left" "$cs" --tool racecheck --error-exitcode 3 "$build/edbatch_tests" \
      -tc="$pattern" > "$work/rc.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 124 ] || status=1
    result=$(grep -oE 'RACECHECK SUMMARY: [0-9]* hazard[s]*' "$work/rc.log" | tail -1)
    [ "$rc" = 124 ] && result="stopped by the time limit, $(grep -c 'Race reported' "$work/rc.log") hazards so far"
    echo "racecheck: ${result:-failed (rc $rc)}, $(( $(date +%s) - start )) s: $c" >&2
    cat "$work/rc.log" >> "$out/racecheck_each.log"
  done < "$work/cases.txt"
fi
if [ "$bench" = 0 ]; then
  rm -rf "$work"
  exit $status
fi

# ---- edbatch run --device cuda: every model, op by op and through blocks, forward and --train ----
: > "$out/run_cuda.log"
for m in $("$build/edbatch" run --help | sed -n 's/.*the model: \([a-z_, ]*\).*/\1/p' | tr ',' ' '); do
  for blocks in "" --no-blocks; do
    for train in "" --train; do
      if "$build/edbatch" run --model "$m" --device cuda --data synthetic:96 --batch 32 --hidden 64 \
           --iters 3 --warmup 1 $blocks $train >> "$out/run_cuda.log" 2>&1; then
        echo "ok   $m $blocks $train" >> "$out/run_cuda.log"
      else
        echo "FAIL $m $blocks $train" >> "$out/run_cuda.log"; status=1
      fi
    done
  done
done
echo "edbatch run --device cuda: $(grep -c '^ok ' "$out/run_cuda.log") runs ok," \
  "$(grep -c '^FAIL ' "$out/run_cuda.log") failed" >&2
grep '^FAIL ' "$out/run_cuda.log" >&2

# ---- the zoo on the GPU ----
bench_args=(--iters "$iters")
[ -n "$models" ] && bench_args+=(--models "$models")
"$build/bench_cuda" "${bench_args[@]}" > "$out/bench_cuda.jsonl" 2> "$work/bench_cuda.txt" || status=1
cat "$work/bench_cuda.txt" >&2

# ---- PyTorch side by side (same data, weights and process layout as edbatch run) ----
if [ "$torch" = 1 ] && [ -f bench/torch_baseline.py ] && [ -x scripts/bench_torch.sh ]; then
  if scripts/bench_torch.sh --edbatch "$build/edbatch" --device cuda --threads 1 \
       --rounds "$rounds" --out "$work/torch" > "$work/torch.log" 2>&1; then
    cp "$work/torch/results.jsonl" "$out/torch_results.jsonl"
    cp "$work/torch/summary.md" "$out/torch_summary.md"
  else
    status=1
    cp "$work/torch.log" "$out/torch_failed.log"
    echo "gpu.sh: PyTorch comparison failed (torch_failed.log)" >&2
  fi
fi

# ---- summary ----
python3 - "$out" "$work/gpu.txt" <<'EOF'
import json, os, sys
out, gpu = sys.argv[1], open(sys.argv[2]).read().strip()
rows = [json.loads(l) for l in open(os.path.join(out, "bench_cuda.jsonl")) if l.strip()]
lines = [f"# edbatch on {gpu}", "",
         "Zoo models through blocks, policy lb-greedy, end-to-end per mini-batch (graph "
         "construction, scheduling, planning, upload, kernels, download; train adds backward and "
         "the SGD update). Device ms: CUDA-event time of the passes; busy = device / end-to-end; "
         "stages: dependent device steps (each stage of a chained launch, each other launch); "
         "build and schedule ms: host time of construction and of scheduling + planning.",
         "", "| model | batch | hidden | mode | instances/s | ms median (p10-p90) | device ms | "
         "busy | kernels/mini-batch | stages | us/stage | build ms | schedule ms | nodes | batches |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['model']} | {r['batch']} | {r['hidden']} | {r['mode']} | "
                 f"{r['instances_per_s']:,.0f} | {r['ms_median']:.2f} ({r['ms_p10']:.2f}-"
                 f"{r['ms_p90']:.2f}) | {r['device_ms_median']:.3f} | "
                 f"{100 * r['device_busy']:.0f}% | {r['kernels_per_minibatch']:.0f} | "
                 f"{r.get('stages_per_minibatch', 0):.0f} | {r.get('device_us_per_stage', 0):.1f} | "
                 f"{r['build_ms_median']:.3f} | {r['schedule_ms_median']:.3f} | "
                 f"{r['nodes']:.0f} | {r['batches']:.0f} |")
torch_md = os.path.join(out, "torch_summary.md")
if os.path.exists(torch_md):
    lines += ["", "## Against PyTorch (scripts/bench_torch.sh, same data and weights)", "",
              open(torch_md).read()]
open(os.path.join(out, "gpu_results.md"), "w").write("\n".join(lines) + "\n")
EOF
echo "gpu.sh: results in $out (gpu_results.md)" >&2
rm -rf "$work"
exit $status

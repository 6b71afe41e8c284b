#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan and UBSan) and runs each for the given
# time, starting from the seed corpora of fuzz/corpus; prints per target the executions, execs/s,
# coverage (libFuzzer's cov: edges and ft: features), the corpus size and any crash, hang or leak
# (an input that reproduces it is written to build-fuzz/artifacts/). Exits 1 when one was found.
#
#   scripts/fuzz.sh [SECONDS] [--targets "trees lattices ..."] [--jobs N] [--build DIR]
#                   [--no-build] [--make-corpus]
#
# SECONDS (default 60) is per target; --jobs runs that many targets at a time. New inputs go to
# DIR/corpus/<target>, which later runs start from too; fuzz/corpus stays as checked in unless
# --make-corpus rewrites its seeds with fuzz_make_corpus (the project's generators and writers).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"  # before the cd: $0 may be relative
cd "$(dirname "$self")/.."

seconds=60
targets="trees lattices tagged safetensors policy pairs packed"
jobs=1
build=build-fuzz
do_build=1
make_corpus=0
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) targets=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --make-corpus) make_corpus=1; shift ;;
    -h|--help) sed -n '2,12p' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) seconds=$1; shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$do_build" = 1 ]; then
  EDBATCH_TORCH=OFF bash scripts/deps.sh
  if ! command -v clang++ > /dev/null; then  # Debian's clang brings libFuzzer
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang
  fi
  generator=()
  command -v ninja > /dev/null && [ ! -f "$build/Makefile" ] && generator=(-G Ninja)
  # AVX2 with FMA rather than the host's whole vector set: clang with ASan and UBSan spends about
  # 150 s on the AVX-512 register tiles of kernels/cpu/gemm.cpp alone (28 s for AVX2), the
  # longest file of the build. The same tiles with 8 lanes are fuzzed; the AVX-512 ones run under
  # ASan and UBSan in the sanitizer step's tests. Hosts without AVX2 and FMA build for themselves.
  arch=(-DEDBATCH_NATIVE=ON)
  if grep -qw avx2 /proc/cpuinfo 2> /dev/null && grep -qw fma /proc/cpuinfo; then
    arch=(-DEDBATCH_NATIVE=OFF "-DCMAKE_CXX_FLAGS=-march=x86-64-v3")
  fi
  start=$(date +%s)
  mkdir -p "$build"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "${arch[@]}" -DEDBATCH_FUZZ=ON -DEDBATCH_CUDA=OFF \
    -DEDBATCH_TORCH=OFF -DEDBATCH_BUILD_TESTS=OFF -DEDBATCH_BUILD_EXAMPLES=OFF \
    -DEDBATCH_BUILD_BENCH=OFF > "$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
  build_targets=()
  for t in $targets; do build_targets+=("fuzz_$t"); done
  [ "$make_corpus" = 1 ] && build_targets+=(fuzz_make_corpus)
  cmake --build "$build" -j "$(nproc)" --target "${build_targets[@]}"
  echo "fuzz.sh: built in $(( $(date +%s) - start )) s" >&2
fi
if [ "$make_corpus" = 1 ]; then
  # Seeds are rewritten; regression inputs (regress_*, inputs that once failed) are kept.
  find fuzz/corpus -name 'seed_*' -delete 2> /dev/null || true
  "$build/fuzz/fuzz_make_corpus" fuzz/corpus
  echo "fuzz.sh: wrote fuzz/corpus ($(find fuzz/corpus -type f | wc -l) seeds)" >&2
fi

mkdir -p "$build/artifacts" "$build/logs"
export ASAN_OPTIONS=print_stacktrace=1 UBSAN_OPTIONS=print_stacktrace=1
run_one() {
  local t=$1
  mkdir -p "$build/corpus/$t"
  # -timeout: an input running 10 s is a hang; leaks are checked (ASan's LeakSanitizer).
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
    "$build/corpus/$t" "fuzz/corpus/$t" > "$build/logs/$t.log" 2>&1
}
status=0
pids=()
names=()
for t in $targets; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ "${#pids[@]}" -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done

printf '%-12s %8s %12s %10s %8s %8s %8s  %s\n' target seconds execs execs/s cov ft corpus result
for t in $targets; do
  log="$build/logs/$t.log"
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<< "$last")
  if grep -qE '^==[0-9]+==ERROR|^SUMMARY: |fuzz contract broken|ERROR: libFuzzer' "$log"; then
    result="FOUND: $(grep -m1 -E 'SUMMARY: |fuzz contract broken|ERROR: libFuzzer' "$log" | cut -c1-100)"
    status=1
  else
    result=ok
  fi
  printf '%-12s %8s %12s %10s %8s %8s %8s  %s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
ls "$build/artifacts" 2> /dev/null | sed "s|^|artifact: $build/artifacts/|" >&2 || true
exit $status

#!/usr/bin/env bash
# Builds the library, the command line and the test binary with sanitizers (Debug with -O1, so
# assertions stay on; CUDA, the PyTorch extension, examples and benchmarks off) and runs the
# CTest suite under them, halting at the first report. Extra arguments go to ctest.
#
#   scripts/sanitize.sh [address,undefined | thread] [--build DIR] [ctest arguments]
#
# address,undefined (the default) builds into build-asan; thread builds into build-tsan against
# a oneTBB built with ThreadSanitizer (scripts/tbb_tsan.sh, into build-tsan/tbb-tsan, once), so
# that TSan sees TBB's synchronisation and needs no suppressions.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizers=address,undefined
build=""
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then sanitizers=$1; shift; fi
if [ $# -gt 1 ] && [ "$1" = --build ]; then build=$2; shift 2; fi
[ -n "$build" ] || { [ "$sanitizers" = thread ] && build=build-tsan || build=build-asan; }

EDBATCH_TORCH=OFF bash scripts/deps.sh
generator=()
command -v ninja > /dev/null && [ ! -f "$build/Makefile" ] && generator=(-G Ninja)
start=$(date +%s)
mkdir -p "$build"
tbb=()
if [ "$sanitizers" = thread ]; then
  [ -f "$build/tbb-tsan/lib/cmake/TBB/TBBConfig.cmake" ] || bash scripts/tbb_tsan.sh "$build/tbb-tsan"
  tbb=(-DTBB_DIR="$PWD/$build/tbb-tsan/lib/cmake/TBB")
fi
cmake -S . -B "$build" "${generator[@]}" "${tbb[@]}" -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-g1 -O1" \
  -DEDBATCH_SANITIZE="$sanitizers" -DEDBATCH_CUDA=OFF -DEDBATCH_TORCH=OFF \
  -DEDBATCH_BUILD_EXAMPLES=OFF -DEDBATCH_BUILD_BENCH=OFF > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)"
echo "sanitize.sh: built $build ($sanitizers) in $(( $(date +%s) - start )) s" >&2

export ASAN_OPTIONS=halt_on_error=1:print_stacktrace=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@"

# Sourced by the CPU benchmark scripts (bench_cpu_train.sh, bench_host.sh), from the repository
# root with $root, $out and $baseline set: builds edbatch_cli (Release, without CUDA and torch)
# in $root and, when $baseline is not empty, in that source tree too, each into its folder $1,
# and sets builds=("$root" ["$baseline"]). Logs go to $out; a failed build prints its tail and
# exits. Missing TBB, fmt or nlohmann-json come from .deb/ as on the GPU machine (gpu_deps.sh).
[ -f scripts/gpu_deps.sh ] && source scripts/gpu_deps.sh
bench_builds() {  # $1: the build folder inside each source tree
  local tree
  builds=("$root")
  [ -n "$baseline" ] && builds+=("$baseline")
  for tree in "${builds[@]}"; do
    cmake -S "$tree" -B "$tree/$1" -DCMAKE_BUILD_TYPE=Release -DEDBATCH_CUDA=OFF \
      -DEDBATCH_TORCH=OFF -DEDBATCH_BUILD_TESTS=OFF -DEDBATCH_BUILD_BENCH=OFF \
      -DEDBATCH_BUILD_EXAMPLES=OFF > "$out/configure.log" 2>&1 &&
      cmake --build "$tree/$1" -j "$(nproc)" --target edbatch_cli > "$out/build.log" 2>&1 ||
      { tail -30 "$out/build.log" >&2; exit 1; }
  done
}

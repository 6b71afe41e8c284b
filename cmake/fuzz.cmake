# libFuzzer targets (fuzz/, docs/reliability.md): -DEDBATCH_FUZZ=ON with clang builds every target
# of the project with coverage instrumentation, ASan and UBSan, and fuzz/ adds one fuzzer per input
# parser. scripts/fuzz.sh configures, builds and runs them.
option(EDBATCH_FUZZ "Build the libFuzzer targets of fuzz/ (clang only)" OFF)
if(EDBATCH_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "EDBATCH_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(EDBATCH_SANITIZE)
    message(FATAL_ERROR "EDBATCH_FUZZ brings its own sanitizers: leave EDBATCH_SANITIZE empty")
  endif()
  set(EDBATCH_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=all)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${EDBATCH_FUZZ_FLAGS}>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "edbatch: libFuzzer targets (fuzz/)")
endif()

# Sanitizer builds: -DEDBATCH_SANITIZE=address,undefined (ASan + UBSan) or thread (TSan) builds
# every target of this project with the sanitizers, keeping frame pointers for readable stacks,
# and makes undefined behaviour halt the program like an ASan report (-fno-sanitize-recover).
# CUDA device code is not instrumented: use compute-sanitizer for it. TSan needs a oneTBB built
# with it too (-DTBB_DIR=..., scripts/tbb_tsan.sh). Run the tests with
#   ASAN_OPTIONS=halt_on_error=1:print_stacktrace=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
#   TSAN_OPTIONS=halt_on_error=1
# (scripts/sanitize.sh does; docs/reliability.md has what each run found).
set(EDBATCH_SANITIZE "" CACHE STRING
    "Sanitizers for the project's targets: address,undefined or thread (empty: none)")
if(EDBATCH_SANITIZE)
  string(REPLACE "," ";" edbatch_sanitizers "${EDBATCH_SANITIZE}")
  foreach(s ${edbatch_sanitizers})
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "EDBATCH_SANITIZE: unknown sanitizer '${s}' (expected address, "
                          "undefined, leak or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST edbatch_sanitizers AND "address" IN_LIST edbatch_sanitizers)
    message(FATAL_ERROR "EDBATCH_SANITIZE: thread cannot be combined with address")
  endif()
  set(EDBATCH_SANITIZE_FLAGS -fsanitize=${EDBATCH_SANITIZE} -fno-omit-frame-pointer
      -fno-sanitize-recover=all)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${EDBATCH_SANITIZE_FLAGS}>")
  add_link_options(${EDBATCH_SANITIZE_FLAGS})
  message(STATUS "edbatch: sanitizers ${EDBATCH_SANITIZE}")
endif()

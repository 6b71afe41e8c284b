# The layout rules of docs/architecture.md, checked by CTest (`layout_rules`):
# - no source file outside tests/ over 600 lines;
# - the core (src/core, fsm, memplan, kernels) includes nothing of the front ends: data formats
#   (src/io, edbatch/data.h, safetensors.h, dump.h), the model zoo (src/zoo, edbatch/models.h,
#   zoo.h) or the PyTorch adapter (src/torch). fsm/fsm_workload.cpp, where the policy trainer
#   samples zoo workloads, is the one file of fsm/ that may;
# - nothing but src/core/options.cpp reads the environment (options, not environment).
# Run: cmake -DROOT=<source dir> -P cmake/check_layout.cmake
cmake_policy(SET CMP0007 NEW)
set(max_lines 600)
file(GLOB_RECURSE sources RELATIVE ${ROOT}
  ${ROOT}/src/*.cpp ${ROOT}/src/*.h ${ROOT}/include/*.h ${ROOT}/fsm/*.cpp ${ROOT}/fsm/*.h
  ${ROOT}/memplan/*.cpp ${ROOT}/memplan/*.h ${ROOT}/kernels/*.cpp ${ROOT}/kernels/*.h
  ${ROOT}/kernels/*.cu ${ROOT}/kernels/*.cuh ${ROOT}/tools/*.cpp ${ROOT}/tools/*.h
  ${ROOT}/bench/*.cpp ${ROOT}/bench/*.h ${ROOT}/bench/*.py ${ROOT}/python/*.py
  ${ROOT}/examples/*.cpp ${ROOT}/examples/*.py ${ROOT}/fuzz/*.cpp ${ROOT}/fuzz/*.h)
set(errors "")
foreach(f ${sources})
  file(READ ${ROOT}/${f} content)
  string(REGEX REPLACE "[^\n]" "" newlines "${content}")
  string(LENGTH "${newlines}" n)
  if(n GREATER max_lines)
    string(APPEND errors "${f}: ${n} lines (at most ${max_lines} outside tests/)\n")
  endif()
  if(NOT f STREQUAL "src/core/options.cpp" AND f MATCHES "\\.(cpp|h|cu|cuh)$")
    file(STRINGS ${ROOT}/${f} env_reads REGEX "getenv\\(")
    if(env_reads)
      string(APPEND errors "${f}: reads the environment (map it in src/core/options.cpp)\n")
    endif()
  endif()
  if(f MATCHES "^(src/core|fsm|memplan|kernels)/" AND NOT f STREQUAL "fsm/fsm_workload.cpp")
    file(STRINGS ${ROOT}/${f} includes REGEX "^#include \"")
    foreach(line ${includes})
      if(line MATCHES "\"(src/io/|src/zoo/|src/torch/|edbatch/(data|safetensors|dump|models|zoo)\\.h)")
        string(APPEND errors "${f}: core code includes a front end: ${line}\n")
      endif()
    endforeach()
  endif()
endforeach()
if(errors)
  message(FATAL_ERROR "layout rules broken:\n${errors}")
endif()
list(LENGTH sources count)
message(STATUS "layout rules hold for ${count} files")

# The PyTorch extension (src/torch/): a shared library that registers torch.ops.edbatch.*, and the
# Python tests (tests/python) as one CTest test. Built when a Python with torch is found; the
# Python package (python/edbatch) loads the library named by EDBATCH_LIBRARY, else its own build
# (`pip install .`, see docs/pytorch.md).
if(NOT EDBATCH_TORCH)
  return()
endif()

# Debian's python3-torch lives in /usr/bin/python3; a python3 earlier on PATH may lack torch.
if(NOT EDBATCH_PYTHON)
  find_program(EDBATCH_DEBIAN_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(EDBATCH_PATH_PYTHON python3)
  foreach(py ${EDBATCH_DEBIAN_PYTHON} ${EDBATCH_PATH_PYTHON})
    execute_process(COMMAND ${py} -c "import torch" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(EDBATCH_PYTHON ${py} CACHE FILEPATH "The Python with torch for the extension and its tests")
      break()
    endif()
  endforeach()
endif()
if(NOT EDBATCH_PYTHON)
  message(STATUS "edbatch: no Python with torch found; the PyTorch extension is not built")
  return()
endif()
execute_process(COMMAND ${EDBATCH_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE EDBATCH_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE)
list(APPEND CMAKE_PREFIX_PATH ${EDBATCH_TORCH_PREFIX})
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(STATUS "edbatch: libtorch's CMake files not found (Debian: libtorch-dev); "
                 "the PyTorch extension is not built")
  return()
endif()
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(STATUS "edbatch: this torch uses the pre-C++11 string ABI, unlike the library; build "
                 "the extension with `pip install .` instead")
  return()
endif()

# The extension links the static library into a shared one.
set_target_properties(edbatch PROPERTIES POSITION_INDEPENDENT_CODE ON)
file(GLOB EDBATCH_TORCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/*.cpp)
add_library(edbatch_torch SHARED ${EDBATCH_TORCH_SOURCES})
target_include_directories(edbatch_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(edbatch_torch PRIVATE edbatch fmt::fmt ${TORCH_LIBRARIES})
target_compile_options(edbatch_torch PRIVATE ${EDBATCH_WARNINGS})
# GCC 13 reports false array-bounds and stringop-overflow errors inside libstdc++'s vector<bool>::reserve as inlined from
# torch::autograd::Function::apply (torch 2.x headers), not in our code.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
  target_compile_options(edbatch_torch PRIVATE -Wno-array-bounds -Wno-stringop-overflow)
endif()
# With a CUDA torch and the CUDA backend, CUDA tensors stay on the GPU (src/torch/ops.cpp reads
# torch's current stream through c10_cuda; EDBATCH_TORCH_HOST_COPY=1 at run time copies through
# host memory instead). Otherwise CUDA tensors go through host memory.
set(EDBATCH_TORCH_GPU "host round trip for CUDA tensors")
if(EDBATCH_CUDA AND TARGET torch_cuda)
  target_compile_definitions(edbatch_torch PRIVATE EDBATCH_TORCH_CUDA)
  set(EDBATCH_TORCH_GPU "CUDA tensors stay on the GPU")
endif()
message(STATUS "edbatch: PyTorch extension for ${EDBATCH_PYTHON} (torch ${Torch_VERSION}; "
               "${EDBATCH_TORCH_GPU})")

if(EDBATCH_BUILD_TESTS)
  execute_process(COMMAND ${EDBATCH_PYTHON} -c "import pytest" RESULT_VARIABLE rc
    OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    add_test(NAME python_tests COMMAND ${CMAKE_COMMAND} -E env
      PYTHONPATH=${CMAKE_CURRENT_SOURCE_DIR}/python EDBATCH_LIBRARY=$<TARGET_FILE:edbatch_torch>
      PYTHONDONTWRITEBYTECODE=1
      ${EDBATCH_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/tests/python)
    # `pip install .` into a fresh virtual environment (tests/python/test_pip_install.py): it
    # compiles the extension again, so it is a test of its own (label pip: `ctest -LE pip`).
    option(EDBATCH_TEST_PIP "Test `pip install .` into a virtual environment (minutes)" ON)
    if(EDBATCH_TEST_PIP)
      add_test(NAME python_pip_install COMMAND ${CMAKE_COMMAND} -E env PYTHONDONTWRITEBYTECODE=1
        ${EDBATCH_PYTHON} -m pytest -q -s -p no:cacheprovider --pip-install
        --basetemp=${CMAKE_CURRENT_BINARY_DIR}/pip-test
        ${CMAKE_CURRENT_SOURCE_DIR}/tests/python/test_pip_install.py)
      set_tests_properties(python_pip_install PROPERTIES LABELS pip TIMEOUT 3600)
    endif()
  else()
    message(STATUS "edbatch: pytest not found for ${EDBATCH_PYTHON}; the Python tests are not run")
  endif()
endif()

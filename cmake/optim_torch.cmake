# The optimizers against torch.optim: tests/tools/optim_steps.cpp applies edbatch's optimizers to
# parameters and gradients from a file, tests/python/test_optim_torch.py runs it and PyTorch on
# the same data. And `edbatch run` against bench/torch_models.py (tests/python/test_cli_torch.py):
# forward losses and one training step. The tests need a Python with torch and pytest (Debian's: /usr/bin/python3), not
# the PyTorch extension.
add_executable(edbatch_optim_steps ${CMAKE_CURRENT_SOURCE_DIR}/tests/tools/optim_steps.cpp)
target_link_libraries(edbatch_optim_steps PRIVATE edbatch)
target_include_directories(edbatch_optim_steps PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(edbatch_optim_steps PRIVATE ${EDBATCH_WARNINGS})
add_dependencies(edbatch_tests edbatch_optim_steps)

if(NOT EDBATCH_TEST_PYTHON)
  find_program(EDBATCH_DEBIAN_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(EDBATCH_PATH_PYTHON python3)
  foreach(py ${EDBATCH_PYTHON} ${EDBATCH_DEBIAN_PYTHON} ${EDBATCH_PATH_PYTHON})
    execute_process(COMMAND ${py} -c "import torch, pytest" RESULT_VARIABLE rc
      OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(EDBATCH_TEST_PYTHON ${py} CACHE FILEPATH "The Python with torch and pytest for tests")
      break()
    endif()
  endforeach()
endif()
if(EDBATCH_TEST_PYTHON)
  add_test(NAME python_optim COMMAND ${CMAKE_COMMAND} -E env PYTHONDONTWRITEBYTECODE=1
    EDBATCH_OPTIM_STEPS=$<TARGET_FILE:edbatch_optim_steps>
    ${EDBATCH_TEST_PYTHON} -m pytest -q -p no:cacheprovider
    ${CMAKE_CURRENT_SOURCE_DIR}/tests/python/test_optim_torch.py)
  if(TARGET edbatch_cli)
    add_test(NAME python_cli_torch COMMAND ${CMAKE_COMMAND} -E env PYTHONDONTWRITEBYTECODE=1
      EDBATCH_CLI=$<TARGET_FILE:edbatch_cli>
      ${EDBATCH_TEST_PYTHON} -m pytest -q -p no:cacheprovider
      ${CMAKE_CURRENT_SOURCE_DIR}/tests/python/test_cli_torch.py)
  endif()
else()
  message(STATUS "edbatch: no Python with torch and pytest; the comparisons with PyTorch are not run")
endif()

# The CUDA backend: on by default when a CUDA compiler is found (the toolkit's usual place
# included), built for Hopper (sm_90 machine code plus PTX) unless CMAKE_CUDA_ARCHITECTURES says
# otherwise. Without a toolkit, or with EDBATCH_CUDA=OFF, the build uses kernels/no_cuda, whose
# make_cuda_backend throws.
include(CheckLanguage)
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(EDBATCH_CUDA_FOUND ON)
else()
  set(EDBATCH_CUDA_FOUND OFF)
endif()
option(EDBATCH_CUDA "Build the CUDA backend (kernels/cuda)" ${EDBATCH_CUDA_FOUND})

if(EDBATCH_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(EDBATCH_CUDA_DIR kernels/cuda)
  message(STATUS "edbatch: CUDA backend on (${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES})")
else()
  set(EDBATCH_CUDA_DIR kernels/no_cuda)
  message(STATUS "edbatch: CUDA backend off (kernels/no_cuda)")
endif()

# Warnings are errors in the host code of our .cu files too; device code keeps nvcc's defaults.
set(EDBATCH_CUDA_WARNINGS -Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings)

# Links the backend's libraries into `target` when the CUDA backend is built.
function(edbatch_link_cuda target)
  if(EDBATCH_CUDA)
    # cuBLAS is opened at run time, when the backend makes its first handle
    # (kernels/cuda/cublas_api.cpp), from the toolkit's directory when the usual search misses.
    target_link_libraries(${target} PRIVATE CUDA::cudart ${CMAKE_DL_LIBS})
    target_compile_definitions(${target} PRIVATE
      EDBATCH_CUDA_LIBRARY_DIR="${CUDAToolkit_LIBRARY_DIR}")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:${EDBATCH_CUDA_WARNINGS}>
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  endif()
endfunction()

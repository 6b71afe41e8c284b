# Install rules and the CMake package (docs/cmake.md). `cmake --install BUILD --prefix P` puts the
# public headers, the static library libedbatch.a and the shared libedbatch.so (linked from the
# same objects, so the sources compile once), the `edbatch` command and the package files into
# P; `find_package(edbatch CONFIG)` then gives edbatch::edbatch (shared) and
# edbatch::edbatch_static. Sanitizer and fuzz builds install nothing.
option(EDBATCH_INSTALL "Build the shared library and the install rules" ON)
if(NOT EDBATCH_INSTALL OR EDBATCH_SANITIZE OR EDBATCH_FUZZ)
  return()
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_target_property(edbatch_type edbatch TYPE)
if(edbatch_type STREQUAL "STATIC_LIBRARY")
  set(edbatch_other SHARED)
  set(edbatch_other_target edbatch_shared)
else()  # BUILD_SHARED_LIBS=ON made the main target shared
  set(edbatch_other STATIC)
  set(edbatch_other_target edbatch_static)
endif()
set_target_properties(edbatch PROPERTIES POSITION_INDEPENDENT_CODE ON)
get_target_property(edbatch_links edbatch LINK_LIBRARIES)
add_library(${edbatch_other_target} ${edbatch_other} $<TARGET_OBJECTS:edbatch>)
target_link_libraries(${edbatch_other_target} PRIVATE ${edbatch_links})
set_target_properties(${edbatch_other_target} PROPERTIES OUTPUT_NAME edbatch LINKER_LANGUAGE CXX)
foreach(t edbatch ${edbatch_other_target})
  get_target_property(type ${t} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    set(edbatch_shared_target ${t})
    set_target_properties(${t} PROPERTIES EXPORT_NAME edbatch VERSION ${PROJECT_VERSION}
      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
      INSTALL_RPATH_USE_LINK_PATH ON)  # TBB or CUDA outside the loader's default folders
  else()
    set_target_properties(${t} PROPERTIES EXPORT_NAME edbatch_static)
  endif()
  target_include_directories(${t} INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${t} INTERFACE cxx_std_17)
  # Whether the CUDA backend is in: get_target_property(v edbatch::edbatch EDBATCH_CUDA).
  set_target_properties(${t} PROPERTIES EDBATCH_CUDA ${EDBATCH_CUDA} EXPORT_PROPERTIES EDBATCH_CUDA)
endforeach()
if(TARGET edbatch_cli)
  set_target_properties(edbatch_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
endif()

set(edbatch_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/edbatch)
install(TARGETS edbatch ${edbatch_other_target} EXPORT edbatchTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/edbatch DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET edbatch_cli)
  install(TARGETS edbatch_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT edbatchTargets NAMESPACE edbatch:: DESTINATION ${edbatch_cmake_dir})
# The build tree is a package too (find_package with edbatch_DIR=<build>): its own targets file
# beside the config, the libraries where they were built and the headers of the source tree.
export(EXPORT edbatchTargets NAMESPACE edbatch:: FILE ${PROJECT_BINARY_DIR}/edbatchTargets.cmake)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/edbatchConfig.cmake.in
  ${PROJECT_BINARY_DIR}/edbatchConfig.cmake INSTALL_DESTINATION ${edbatch_cmake_dir})
# 0.x: a new minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/edbatchConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/edbatchConfig.cmake
  ${PROJECT_BINARY_DIR}/edbatchConfigVersion.cmake DESTINATION ${edbatch_cmake_dir})

# CTest: install into a prefix inside the build tree, then configure, build and run the
# out-of-tree project of examples/installed against it (both library kinds).
if(EDBATCH_BUILD_TESTS)
  set(edbatch_pkg ${PROJECT_BINARY_DIR}/package-test)
  add_test(NAME package_install COMMAND ${CMAKE_COMMAND} --install ${PROJECT_BINARY_DIR}
    --prefix ${edbatch_pkg}/prefix)
  set_tests_properties(package_install PROPERTIES FIXTURES_SETUP edbatch_package)
  set(edbatch_example_options -DCMAKE_PREFIX_PATH=${edbatch_pkg}/prefix
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DEXPECT_CUDA=${EDBATCH_CUDA} -DEDBATCH_COMMAND=${edbatch_pkg}/prefix/${CMAKE_INSTALL_BINDIR}/edbatch)
  if(EDBATCH_CUDA AND CUDAToolkit_LIBRARY_ROOT)  # the toolkit this build used
    list(APPEND edbatch_example_options -DCUDAToolkit_ROOT=${CUDAToolkit_LIBRARY_ROOT})
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER)
    list(APPEND edbatch_example_options -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  add_test(NAME package_example COMMAND ${CMAKE_CTEST_COMMAND}
    --build-and-test ${PROJECT_SOURCE_DIR}/examples/installed ${edbatch_pkg}/example
    --build-generator ${CMAKE_GENERATOR} --build-noclean
    --build-options ${edbatch_example_options}
    --test-command ${CMAKE_CTEST_COMMAND} --output-on-failure)
  set_tests_properties(package_example PROPERTIES FIXTURES_REQUIRED edbatch_package)
  # The same example against the build tree itself (edbatch_DIR, nothing installed).
  list(FILTER edbatch_example_options EXCLUDE REGEX "^-D(CMAKE_PREFIX_PATH|EDBATCH_COMMAND)=")
  add_test(NAME package_build_tree COMMAND ${CMAKE_CTEST_COMMAND}
    --build-and-test ${PROJECT_SOURCE_DIR}/examples/installed ${edbatch_pkg}/example-build-tree
    --build-generator ${CMAKE_GENERATOR} --build-noclean
    --build-options ${edbatch_example_options} -Dedbatch_DIR=${PROJECT_BINARY_DIR}
    --test-command ${CMAKE_CTEST_COMMAND} --output-on-failure)
endif()

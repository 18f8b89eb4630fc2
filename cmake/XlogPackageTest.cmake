# cmake -DMODE=build_tree|install_tree -DXLOG_BINARY_DIR=... -DCONSUMER_SOURCE_DIR=...
#       -DWORK_DIR=... -DGENERATOR=... [-DMAKE_PROGRAM=...] -DC_COMPILER=... -DCXX_COMPILER=...
#       -DREADELF=... -DINSTALL_LIBDIR=... -DINSTALL_INCLUDEDIR=... -DINSTALL_CMAKEDIR=...
#       -DLIBRARY_FILE_NAME=... -DSONAME=... -P XlogPackageTest.cmake
#
# Builds and runs the downstream project in CONSUMER_SOURCE_DIR against
#   build_tree:   the XlogCudaConfig.cmake of the build tree XLOG_BINARY_DIR
#   install_tree: a fresh `cmake --install` of XLOG_BINARY_DIR into WORK_DIR/prefix
# and checks what a downstream user relies on: the installed file layout,
# which config find_package really used, DT_NEEDED libxlog_cuda.so.0 in the
# consumer, and that the consumer runs.

cmake_minimum_required(VERSION 3.22)

foreach(var MODE XLOG_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR C_COMPILER CXX_COMPILER READELF
            INSTALL_LIBDIR INSTALL_INCLUDEDIR INSTALL_CMAKEDIR LIBRARY_FILE_NAME SONAME)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "XlogPackageTest: ${var} is not set")
  endif()
endforeach()

# Run a command; on failure stop with its output.
function(xlog_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "XlogPackageTest (${MODE}): ${what} failed (${result}):\n${output}")
  endif()
  set(xlog_run_output "${output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(configure_args
  -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  # Only the location given below may satisfy find_package.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

if(MODE STREQUAL "build_tree")
  set(expected_config_dir "${XLOG_BINARY_DIR}")
  list(APPEND configure_args "-DXlogCuda_DIR=${XLOG_BINARY_DIR}")
elseif(MODE STREQUAL "install_tree")
  set(prefix "${WORK_DIR}/prefix")
  xlog_run("cmake --install" "${CMAKE_COMMAND}" --install "${XLOG_BINARY_DIR}" --prefix "${prefix}")

  # The layout a distribution or a downstream build expects.
  set(libdir "${prefix}/${INSTALL_LIBDIR}")
  foreach(file
      "${libdir}/${LIBRARY_FILE_NAME}"
      "${prefix}/${INSTALL_INCLUDEDIR}/xlog_cuda.h"
      "${prefix}/${INSTALL_INCLUDEDIR}/xlog/runtime.hpp"
      "${prefix}/${INSTALL_CMAKEDIR}/XlogCudaConfig.cmake"
      "${prefix}/${INSTALL_CMAKEDIR}/XlogCudaConfigVersion.cmake")
    if(NOT EXISTS "${file}")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): not installed: ${file}")
    endif()
  endforeach()
  if(IS_SYMLINK "${libdir}/${LIBRARY_FILE_NAME}")
    message(FATAL_ERROR "XlogPackageTest (${MODE}): ${libdir}/${LIBRARY_FILE_NAME} must be a file, not a link")
  endif()
  foreach(link_and_target "${SONAME}=${LIBRARY_FILE_NAME}" "libxlog_cuda.so=${SONAME}")
    string(REPLACE "=" ";" pair "${link_and_target}")
    list(GET pair 0 link)
    list(GET pair 1 target)
    if(NOT IS_SYMLINK "${libdir}/${link}")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): ${libdir}/${link} is missing or not a symlink")
    endif()
    file(READ_SYMLINK "${libdir}/${link}" points_to)
    if(NOT points_to STREQUAL target)
      message(FATAL_ERROR "XlogPackageTest (${MODE}): ${libdir}/${link} -> '${points_to}', expected '${target}'")
    endif()
  endforeach()
  # With XLOG_STRIP (the default), the installed library is stripped: no debug sections, a
  # .gnu_debuglink naming its .debug file, which `--component debug`
  # installs beside it with the debug info.
  if(STRIPPED)
    xlog_run("readelf -S" "${READELF}" -S -W "${libdir}/${LIBRARY_FILE_NAME}")
    if(xlog_run_output MATCHES "\\.debug_info")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): the installed ${LIBRARY_FILE_NAME} carries debug info")
    endif()
    if(NOT xlog_run_output MATCHES "\\.gnu_debuglink")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): the installed ${LIBRARY_FILE_NAME} has no .gnu_debuglink")
    endif()
    if(EXISTS "${libdir}/${LIBRARY_FILE_NAME}.debug")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): the .debug file was installed without --component debug")
    endif()
    xlog_run("cmake --install --component debug"
      "${CMAKE_COMMAND}" --install "${XLOG_BINARY_DIR}" --prefix "${prefix}" --component debug)
    if(NOT EXISTS "${libdir}/${LIBRARY_FILE_NAME}.debug")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): --component debug installed no ${LIBRARY_FILE_NAME}.debug")
    endif()
    xlog_run("readelf -S (debug file)" "${READELF}" -S -W "${libdir}/${LIBRARY_FILE_NAME}.debug")
    if(NOT xlog_run_output MATCHES "\\.debug_info")
      message(FATAL_ERROR "XlogPackageTest (${MODE}): ${LIBRARY_FILE_NAME}.debug holds no .debug_info")
    endif()
    file(SIZE "${libdir}/${LIBRARY_FILE_NAME}" stripped_size)
    message(STATUS "installed ${LIBRARY_FILE_NAME}: ${stripped_size} bytes, stripped; debug info in the debug component")
  endif()

  # The installed config must not point back into the build or source tree.
  file(READ "${prefix}/${INSTALL_CMAKEDIR}/XlogCudaConfig.cmake" installed_config)
  string(FIND "${installed_config}" "${XLOG_BINARY_DIR}" build_path_at)
  if(NOT build_path_at EQUAL -1)
    message(FATAL_ERROR "XlogPackageTest (${MODE}): the installed config refers to the build tree ${XLOG_BINARY_DIR}")
  endif()

  set(expected_config_dir "${prefix}/${INSTALL_CMAKEDIR}")
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}")
else()
  message(FATAL_ERROR "XlogPackageTest: MODE must be build_tree or install_tree, not '${MODE}'")
endif()

xlog_run("configuring the consumer" "${CMAKE_COMMAND}" ${configure_args})
xlog_run("building the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")

# Which config did find_package take?
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" found_dir REGEX "^XlogCuda_DIR:")
string(REGEX REPLACE "^XlogCuda_DIR:[A-Z]*=" "" found_dir "${found_dir}")
get_filename_component(found_dir "${found_dir}" REALPATH)
get_filename_component(expected_real "${expected_config_dir}" REALPATH)
if(NOT found_dir STREQUAL expected_real)
  message(FATAL_ERROR "XlogPackageTest (${MODE}): find_package used ${found_dir}, expected ${expected_real}")
endif()

foreach(program consumer_c consumer_cpp)
  set(exe "${WORK_DIR}/build/${program}")
  if(NOT EXISTS "${exe}")
    message(FATAL_ERROR "XlogPackageTest (${MODE}): ${exe} was not built")
  endif()
  xlog_run("readelf -d ${program}" "${READELF}" -d "${exe}")
  if(NOT xlog_run_output MATCHES "\\(NEEDED\\)[^\n]*\\[${SONAME}\\]")
    message(FATAL_ERROR "XlogPackageTest (${MODE}): ${program} has no DT_NEEDED ${SONAME}:\n${xlog_run_output}")
  endif()
  if(MODE STREQUAL "install_tree")
    # Found at run time through the prefix, not through the build tree.
    string(FIND "${xlog_run_output}" "${libdir}" runpath_at)
    if(runpath_at EQUAL -1)
      message(FATAL_ERROR "XlogPackageTest (${MODE}): ${program} has no run path to ${libdir}:\n${xlog_run_output}")
    endif()
  endif()
  xlog_run("running ${program}" "${exe}")
  if(NOT xlog_run_output MATCHES "${program} OK")
    message(FATAL_ERROR "XlogPackageTest (${MODE}): ${program} did not report success:\n${xlog_run_output}")
  endif()
  message(STATUS "${xlog_run_output}")
endforeach()
message(STATUS "XlogPackageTest (${MODE}): consumer found XlogCuda in ${found_dir}, built and ran")

# cmake -DNM=<nm> -DLIBRARY=<.so> [-DHEADER=<xlog_cuda.h>]
#       [-DTESTING_HEADER=<xlog/testing.h>] -P XlogCheckExports.cmake
#
# Fails if LIBRARY defines any dynamic symbol not starting with "xlog_": a
# Rust cdylib must not leak std or dependency symbols into an engine's
# namespace. With HEADER (the production header; with TESTING_HEADER too,
# include/xlog/testing.h), also fails if a function a header declares is not
# exported (the header and the library would disagree at link time), or if
# the library exports an xlog_ function that no header declares (an entry
# point nobody can call by its documented prototype).

cmake_minimum_required(VERSION 3.22)

foreach(var NM LIBRARY)
  if(NOT ${var})
    message(FATAL_ERROR "XlogCheckExports: ${var} is not set")
  endif()
endforeach()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "XlogCheckExports: ${LIBRARY} does not exist (was the library built?)")
endif()

execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE error)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "XlogCheckExports: '${NM} -D --defined-only ${LIBRARY}' failed (${result}): ${error}")
endif()

# Lines are "<address> <type> <name>[@version]".
string(REPLACE "\n" ";" lines "${output}")
set(exported "")
set(foreign "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ @]+)")
    set(name "${CMAKE_MATCH_1}")
    list(APPEND exported "${name}")
    if(NOT name MATCHES "^xlog_")
      list(APPEND foreign "${name}")
    endif()
  elseif(NOT line STREQUAL "")
    message(FATAL_ERROR "XlogCheckExports: cannot parse nm output line '${line}'")
  endif()
endforeach()

list(LENGTH exported exported_count)
if(exported_count EQUAL 0)
  message(FATAL_ERROR "XlogCheckExports: ${LIBRARY} exports no symbols at all")
endif()
if(foreign)
  list(JOIN foreign "\n  " foreign_text)
  message(FATAL_ERROR "XlogCheckExports: ${LIBRARY} exports symbols outside the xlog_ namespace:\n  ${foreign_text}")
endif()

set(headers "")
foreach(var HEADER TESTING_HEADER)
  if(${var})
    list(APPEND headers "${${var}}")
  endif()
endforeach()

if(headers)
  set(declared "")
  foreach(header IN LISTS headers)
    file(READ "${header}" header_text)
    # Function declarations: a line starting with the return type (comment
    # lines are indented, directives start with '#'), then "xlog_name(".
    string(REGEX MATCHALL "[\n][A-Za-z_][^#\n(]*[ *](xlog_[A-Za-z0-9_]+)\\(" declarations "${header_text}")
    set(declared_here 0)
    foreach(declaration IN LISTS declarations)
      string(REGEX REPLACE ".*[ *](xlog_[A-Za-z0-9_]+)\\($" "\\1" name "${declaration}")
      list(APPEND declared "${name}")
      math(EXPR declared_here "${declared_here} + 1")
    endforeach()
    if(declared_here EQUAL 0)
      message(FATAL_ERROR "XlogCheckExports: found no function declarations in ${header}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES declared)
  list(LENGTH declared declared_count)
  set(missing "")
  foreach(name IN LISTS declared)
    if(NOT name IN_LIST exported)
      list(APPEND missing "${name}")
    endif()
  endforeach()
  if(declared_count EQUAL 0)
    message(FATAL_ERROR "XlogCheckExports: found no function declarations in ${headers}")
  endif()
  if(missing)
    list(JOIN missing "\n  " missing_text)
    message(FATAL_ERROR "XlogCheckExports: declared in ${headers} but not exported by ${LIBRARY}:\n  ${missing_text}")
  endif()
  set(undeclared "")
  foreach(name IN LISTS exported)
    if(NOT name IN_LIST declared)
      list(APPEND undeclared "${name}")
    endif()
  endforeach()
  if(undeclared)
    list(JOIN undeclared "\n  " undeclared_text)
    message(FATAL_ERROR "XlogCheckExports: exported by ${LIBRARY} but declared in none of ${headers}:\n  ${undeclared_text}")
  endif()
  message(STATUS "all ${declared_count} functions of ${headers} are exported, and nothing else")
endif()
message(STATUS "${exported_count} dynamic symbols of ${LIBRARY}, all xlog_*")

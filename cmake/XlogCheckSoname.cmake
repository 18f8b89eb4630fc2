# cmake -DREADELF=<readelf> -DLIBRARY=<.so> -DEXPECTED_SONAME=<name> -P XlogCheckSoname.cmake
#
# Fails unless the dynamic section of LIBRARY names exactly EXPECTED_SONAME:
# the loader resolves consumers' DT_NEEDED by this name, so a wrong or
# missing SONAME breaks every installed program at run time, not at link.

cmake_minimum_required(VERSION 3.22)

foreach(var READELF LIBRARY EXPECTED_SONAME)
  if(NOT ${var})
    message(FATAL_ERROR "XlogCheckSoname: ${var} is not set")
  endif()
endforeach()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "XlogCheckSoname: ${LIBRARY} does not exist (was the library built?)")
endif()

execute_process(COMMAND "${READELF}" -d "${LIBRARY}"
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE error)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "XlogCheckSoname: '${READELF} -d ${LIBRARY}' failed (${result}): ${error}")
endif()

string(REGEX MATCHALL "Library soname: \\[[^]]*\\]" sonames "${output}")
list(LENGTH sonames count)
if(count EQUAL 0)
  message(FATAL_ERROR "XlogCheckSoname: ${LIBRARY} has no SONAME (expected ${EXPECTED_SONAME})")
endif()
if(NOT count EQUAL 1)
  message(FATAL_ERROR "XlogCheckSoname: ${LIBRARY} has ${count} SONAME entries: ${sonames}")
endif()
string(REGEX REPLACE "Library soname: \\[([^]]*)\\]" "\\1" soname "${sonames}")
if(NOT soname STREQUAL EXPECTED_SONAME)
  message(FATAL_ERROR "XlogCheckSoname: ${LIBRARY} has SONAME '${soname}', expected '${EXPECTED_SONAME}'")
endif()
message(STATUS "SONAME of ${LIBRARY}: ${soname}")

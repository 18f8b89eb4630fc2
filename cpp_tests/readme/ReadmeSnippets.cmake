# ReadmeSnippets.cmake — compile and run the ```c or ```cpp code blocks of
# Markdown files, as a ctest (cmake -P). Each block is a complete program: it
# is written out as it stands in the file (plus a #line directive, so that a
# compiler error names the Markdown file and line), compiled with warnings as
# errors against the xlog headers and library, and run. The test fails if a
# block does not compile, a program exits non-zero, or there are fewer blocks
# than MIN_BLOCKS in all the files together (so deleting the snippets cannot
# make the test pass). MARKDOWN is one path or several joined by "|" (a ";"
# would split the argument on ctest's command line).
#
#   cmake "-DMARKDOWN=README.md|docs/usage.md" -DFENCE=c -DCOMPILER=/usr/bin/cc
#         "-DFLAGS=-std=c99 -Wall -Werror" -DINCLUDE_DIR=include
#         -DLIBRARY=build/lib/libxlog_cuda.so -DWORK_DIR=build/readme/c
#         [-DMIN_BLOCKS=1] [-DRUN_TIMEOUT=60] -P ReadmeSnippets.cmake
#
# FENCE is the info string after the opening ``` (the whole string must
# match: "c" does not select "cpp"). The programs run in the environment
# ctest gives the test (the sim backend: see CMakeLists.txt here).

cmake_minimum_required(VERSION 3.22)

foreach(required MARKDOWN FENCE COMPILER INCLUDE_DIR LIBRARY WORK_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "ReadmeSnippets.cmake: -D${required}=... is required")
  endif()
endforeach()
if(NOT DEFINED MIN_BLOCKS)
  set(MIN_BLOCKS 1)
endif()
if(NOT DEFINED RUN_TIMEOUT)
  set(RUN_TIMEOUT 60)
endif()
separate_arguments(FLAGS UNIX_COMMAND "${FLAGS}")
if(FENCE STREQUAL "c")
  set(extension c)
else()
  set(extension cpp)
endif()

set(opening "\n```${FENCE}\n")
string(LENGTH "${opening}" opening_length)

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
get_filename_component(library_dir "${LIBRARY}" DIRECTORY)

string(REPLACE "|" ";" markdown_files "${MARKDOWN}")
set(blocks 0)
set(failures "")
foreach(MARKDOWN IN LISTS markdown_files)
  file(READ "${MARKDOWN}" text)
  # A leading newline lets the first line be found like every other one.
  set(text "\n${text}")
  get_filename_component(markdown_stem "${MARKDOWN}" NAME_WE)

  # Walk the text by offsets. The code is never treated as a CMake list (it is
  # full of semicolons): only string(FIND) / string(SUBSTRING) touch it.
  set(rest "${text}")
  set(consumed 0)  # characters of `text` before `rest`
  while(TRUE)
    string(FIND "${rest}" "${opening}" start)
    if(start EQUAL -1)
      break()
    endif()
    math(EXPR code_start "${start} + ${opening_length}")
    string(SUBSTRING "${rest}" ${code_start} -1 after_opening)
    # The closing fence: ``` at the start of a line.
    string(FIND "${after_opening}" "\n```" code_length)
    if(code_length EQUAL -1)
      message(FATAL_ERROR "${MARKDOWN}: a ```${FENCE} block is never closed")
    endif()
    math(EXPR code_length "${code_length} + 1")  # keep the code's last newline
    string(SUBSTRING "${after_opening}" 0 ${code_length} code)

    # Markdown line of the block's first code line: the newlines before it in
    # the file, plus one for the leading "\n" added above, which is exactly
    # the 1-based line number.
    math(EXPR absolute_code_start "${consumed} + ${code_start}")
    string(SUBSTRING "${text}" 0 ${absolute_code_start} before)
    string(REGEX REPLACE "[^\n]" "" newlines "${before}")
    string(LENGTH "${newlines}" line)

    math(EXPR blocks "${blocks} + 1")
    set(name "snippet_${blocks}_${markdown_stem}_line_${line}")
    set(source "${WORK_DIR}/${name}.${extension}")
    set(program "${WORK_DIR}/${name}")
    file(WRITE "${source}" "#line ${line} \"${MARKDOWN}\"\n${code}")

    message(STATUS "${MARKDOWN}:${line}: ```${FENCE} block ${blocks}: compiling")
    execute_process(
      COMMAND "${COMPILER}" ${FLAGS} "-I${INCLUDE_DIR}" "${source}" -o "${program}"
              "${LIBRARY}" "-Wl,-rpath,${library_dir}"
      RESULT_VARIABLE compile_result
      OUTPUT_VARIABLE compile_output
      ERROR_VARIABLE compile_output)
    if(NOT compile_result EQUAL 0)
      message("${compile_output}")
      message(STATUS "${MARKDOWN}:${line}: FAILED to compile (${compile_result})")
      list(APPEND failures "block ${blocks} at ${MARKDOWN}:${line} (compile)")
    else()
      execute_process(
        COMMAND "${program}"
        WORKING_DIRECTORY "${WORK_DIR}"
        TIMEOUT ${RUN_TIMEOUT}
        RESULT_VARIABLE run_result
        OUTPUT_VARIABLE run_output
        ERROR_VARIABLE run_output)
      message("${run_output}")
      if(run_result EQUAL 0)
        message(STATUS "${MARKDOWN}:${line}: ran, exit 0")
      else()
        message(STATUS "${MARKDOWN}:${line}: FAILED: exit ${run_result}")
        list(APPEND failures "block ${blocks} at ${MARKDOWN}:${line} (run: ${run_result})")
      endif()
    endif()

    math(EXPR advance "${code_start} + ${code_length}")
    math(EXPR consumed "${consumed} + ${advance}")
    string(SUBSTRING "${rest}" ${advance} -1 rest)
  endwhile()
endforeach()
string(REPLACE ";" ", " MARKDOWN "${markdown_files}")  # for the messages below

if(blocks LESS MIN_BLOCKS)
  message(FATAL_ERROR "${MARKDOWN}: found ${blocks} ```${FENCE} block(s), expected at least ${MIN_BLOCKS}")
endif()
if(failures)
  list(LENGTH failures failed)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "${failed} of ${blocks} ```${FENCE} block(s) failed:\n  ${failures}")
endif()
message(STATUS "${blocks} ```${FENCE} block(s) of ${MARKDOWN} compiled and ran")

# Runs the demo engine and checks that it still tells its story (ctest
# demo_engine*): the lines below must appear in its output, in this order,
# and it must end with RESULT OK. Keep them in step with print_story() in
# examples/demo_engine.cpp.
#
#   cmake -DDEMO=path/to/xlog_demo [-DDEMO_ARGS="--peer-device 1"] -DLOG=path.csv -P XlogDemoStory.cmake
#
# Exit 77 from the demo (no CUDA device) prints "SKIP:" (the tests' SKIP_REGULAR_EXPRESSION).

if(NOT DEMO)
  message(FATAL_ERROR "XlogDemoStory.cmake: pass -DDEMO=<the xlog_demo binary>")
endif()
separate_arguments(_args UNIX_COMMAND "${DEMO_ARGS}")
if(LOG)
  list(APPEND _args --log "${LOG}")
endif()
execute_process(COMMAND "${DEMO}" ${_args} OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
message("${_out}${_err}")
if(_rc EQUAL 77)
  message("SKIP: the demo found no usable CUDA device")
  return()
endif()
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the demo exited with ${_rc}")
endif()

# Each a regular expression, matched against what follows the previous one.
set(_story
  "What xlog ordered"
  "prepare_all before, finish_all after"
  "stages read blocks written on other streams: 0 of them started early"
  "each free waited on the GPU for the block's last reader"
  "What xlog caught"
  "Stale handle: [^\n]* was refused:"
  "XLOG_ERR_USE_AFTER_FREE: "
  "Read racing a free: "
  "The free waited for the reader"
  "What the budget did"
  "request under the 64 MiB budget was refused:"
  "XLOG_ERR_OUT_OF_BUDGET: [^\n]*requested [0-9]+ bytes"
  "(Nothing|No block) changed: [^\n]*before and after"
  "Held versus live"
  "Peak live [^\n]*: the most the engine's blocks added up to"
  "Peak held [^\n]*: the device memory xlog mapped"
  "the arena maps whole 2 MiB pages"
  "xlog holds 0 bytes"
  "Memory log: [^\n]+ rows from this run"
  "HTML memory report: python3 -m xlog_cuda.report [^\n]+ -o [^\n]+[.]html"
  "RESULT OK")
set(_rest "${_out}")
foreach(_line IN LISTS _story)
  string(REGEX MATCH "${_line}" _found "${_rest}")
  if(_found STREQUAL "")
    message(FATAL_ERROR "the demo's story lost a line (or its order): no match for \"${_line}\"")
  endif()
  string(FIND "${_rest}" "${_found}" _at)
  string(LENGTH "${_found}" _len)
  math(EXPR _next "${_at} + ${_len}")
  string(SUBSTRING "${_rest}" ${_next} -1 _rest)
endforeach()

# The numbers issue 26 found unexplained stay out.
foreach(_gone "pending before drain" "reaped by" "released by trim" "reclaimed under pressure" "peak outstanding")
  string(FIND "${_out}" "${_gone}" _at)
  if(NOT _at EQUAL -1)
    message(FATAL_ERROR "the demo prints \"${_gone}\" again, a number without its meaning")
  endif()
endforeach()

# Runs one program as a user would: --help prints the usage and exits 0; an unknown flag exits 2
# with a message naming it; and when FLAG is given, FLAG=BAD_VALUE and FLAG BAD_VALUE are the same
# bad command line (exit 2, the message names the flag and the value), so both forms reach it.
# PROGRAM; ARGS, the words (comma-separated) that make the rest of the command line complete;
# HELP_ONLY for a program whose flags belong to Google Benchmark.
string(REPLACE "," ";" ARGS "${ARGS}")
function(run_program expected_rc)
  execute_process(COMMAND ${PROGRAM} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc STREQUAL expected_rc)
    message(FATAL_ERROR "${PROGRAM} ${ARGN}: exit ${rc}, expected ${expected_rc}\n${out}${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_in text what)
  string(FIND "${text}" "${what}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "'${what}' missing from:\n${text}")
  endif()
endfunction()

run_program(0 --help)
if(HELP_ONLY)
  expect_in("${out}" "--benchmark_filter")
  return()
endif()
expect_in("${out}" "Usage:")
if(FLAG)
  expect_in("${out}" "${FLAG}")
endif()

run_program(2 ${ARGS} --no-such-flag)
expect_in("${err}" "--no-such-flag")

if(FLAG)
  run_program(2 ${ARGS} ${FLAG}=${BAD_VALUE})
  expect_in("${err}" "${FLAG}")
  expect_in("${err}" "${BAD_VALUE}")
  set(equals_form "${err}")
  run_program(2 ${ARGS} ${FLAG} ${BAD_VALUE})
  if(NOT err STREQUAL equals_form)
    message(FATAL_ERROR "${FLAG} ${BAD_VALUE} and ${FLAG}=${BAD_VALUE} differ:\n${err}\n${equals_form}")
  endif()
endif()
message(STATUS "${PROGRAM}: --help, an unknown flag and ${FLAG} in both forms as promised")

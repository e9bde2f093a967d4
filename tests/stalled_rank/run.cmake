# Runs stalled_rank_program on 3 ranks with a 3 s collective timeout and a trace directory, then
# checks each rank's error and what zeroshard-trace makes of the dumps, before and after the
# stopped rank was resumed. mpirun's exit status is not checked: the ranks end without
# MPI_Finalize on purpose. Inputs: MPIEXEC, MPIEXEC_FLAGS (space-separated), PROGRAM,
# TRACE_TOOL, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(ENV{ZEROSHARD_COLLECTIVE_TIMEOUT_S} 3)
set(ENV{ZEROSHARD_TRACE_DIR} ${WORK_DIR}/trace)
separate_arguments(flags UNIX_COMMAND "${MPIEXEC_FLAGS}")
string(TIMESTAMP started "%s")
execute_process(COMMAND ${MPIEXEC} ${flags} -np 3 ${PROGRAM} ${WORK_DIR}
                TIMEOUT 50 RESULT_VARIABLE mpirun_rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP ended "%s")
math(EXPR took "${ended} - ${started}")
message(STATUS "mpirun took ${took} s (exit: ${mpirun_rc})")
if(mpirun_rc MATCHES "timeout")
  message(FATAL_ERROR "the run did not end within 50 s:\n${out}\n${err}")
endif()

function(expect_in file text)
  if(NOT EXISTS ${WORK_DIR}/${file})
    message(FATAL_ERROR "${file} is missing; the run printed:\n${out}\n${err}")
  endif()
  file(READ ${WORK_DIR}/${file} content)
  string(FIND "${content}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${file} lacks '${text}':\n${content}")
  endif()
endfunction()

foreach(waiting 0 1)
  expect_in(result-rank-${waiting}.txt "collective #7 reduce-scatter of 3072 fp32 elements")
  expect_in(result-rank-${waiting}.txt "rank 2: no answer")
  # On a loaded machine the other waiting rank may answer too late and be listed as well.
  file(READ ${WORK_DIR}/result-rank-${waiting}.txt content)
  if(NOT content MATCHES "Behind or missing: rank ([01],)?2\\.")
    message(FATAL_ERROR "rank ${waiting} does not name rank 2 as behind or missing:\n${content}")
  endif()
  expect_in(result-rank-${waiting}.txt "trace/rank-${waiting}.json")
endforeach()
expect_in(result-rank-2.txt "This rank is the one that stalled")
file(READ ${WORK_DIR}/result-rank-2.txt resumed)
string(FIND "${resumed}" "Behind or missing" blames_others)
if(NOT blames_others EQUAL -1)
  message(FATAL_ERROR "the resumed rank blames its peers:\n${resumed}")
endif()

function(expect_trace dir)
  execute_process(COMMAND ${TRACE_TOOL} ${WORK_DIR}/${dir} TIMEOUT 20
                  RESULT_VARIABLE rc OUTPUT_VARIABLE report ERROR_VARIABLE report_err)
  message(STATUS "zeroshard-trace ${dir} (exit ${rc}):\n${report}${report_err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "zeroshard-trace ${dir} exited ${rc}, expected 0 (a rank named)")
  endif()
  foreach(text ${ARGN})
    string(FIND "${report}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "zeroshard-trace ${dir} does not say '${text}'")
    endif()
  endforeach()
endfunction()

expect_trace(trace-while-stopped "rank 2: no dump (dead or stopped"
             "ranks 0,1 are waiting in #7 reduce-scatter")
expect_trace(trace "rank 2 is behind: it started #7" "ranks 0,1 are waiting in #7 reduce-scatter")

# Installs the built tree into a scratch prefix, then configures, builds and runs a tiny consumer
# project that uses find_package(zeroshard), and builds and runs the same program with the flags
# pkg-config gives — proof that both package descriptions are complete. Every installed program
# then prints its --help from the prefix, finding the installed library on its own.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ZEROSHARD_BINARY_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
                        "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "consumer printed: ${out}")
if(rc)
  message(FATAL_ERROR "the consumer exited with ${rc}")
endif()

if(EXISTS ${WORK_DIR}/build/torch_consumer)
  execute_process(COMMAND ${WORK_DIR}/build/torch_consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "torch consumer printed: ${out}")
  if(rc)
    message(FATAL_ERROR "the torch consumer exited with ${rc}")
  endif()
elseif(EXISTS ${WORK_DIR}/prefix/${INSTALL_LIBDIR}/cmake/zeroshard/zeroshardTorchTargets.cmake)
  message(FATAL_ERROR "zeroshard::torch is installed but the consumer did not get it")
endif()
# A program that calls only the adapter's API does not list libzeroshard (the linker drops it
# under --as-needed): the installed adapter finds it beside itself.
file(GLOB torch_library ${WORK_DIR}/prefix/${INSTALL_LIBDIR}/libzeroshard_torch.so.*.*.*)
if(torch_library)
  execute_process(COMMAND readelf -d ${torch_library} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
  if(rc OR NOT dynamic MATCHES "(RUNPATH|RPATH)[^\n]*[$]ORIGIN")
    message(FATAL_ERROR "the installed ${torch_library} has no RUNPATH $ORIGIN:\n${dynamic}")
  endif()
endif()

find_program(PKG_CONFIG pkg-config REQUIRED)
set(pc_env PKG_CONFIG_PATH=${WORK_DIR}/prefix/${INSTALL_LIBDIR}/pkgconfig)
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${pc_env} ${PKG_CONFIG} --cflags --libs zeroshard
                RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc)
  message(FATAL_ERROR "pkg-config --cflags --libs zeroshard failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${pc_env} ${PKG_CONFIG} --variable=libdir zeroshard
                OUTPUT_VARIABLE pc_libdir OUTPUT_STRIP_TRAILING_WHITESPACE)
separate_arguments(pc_flag_list UNIX_COMMAND "${pc_flags}")
separate_arguments(build_flag_list UNIX_COMMAND "${CXX_FLAGS} ${EXE_LINKER_FLAGS}")
execute_process(COMMAND ${CXX} -std=c++20 ${build_flag_list} ${CONSUMER_SOURCE_DIR}/main.cpp
                        ${pc_flag_list} -o ${WORK_DIR}/consumer_pkg_config RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer with pkg-config's flags (${pc_flags}) failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${pc_libdir}
                        ${WORK_DIR}/consumer_pkg_config RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer built with pkg-config's flags exited with ${rc}")
endif()

# The programs a user runs: the tools, and with the examples and benchmarks built, the trainers
# and benchmarks too.
file(GLOB programs ${WORK_DIR}/prefix/bin/*)
string(REPLACE "," ";" EXPECTED_PROGRAMS "${EXPECTED_PROGRAMS}")
foreach(expected zeroshard-config zeroshard-estimate zeroshard-trace zeroshard-consolidate
                 ${EXPECTED_PROGRAMS})
  if(NOT EXISTS ${WORK_DIR}/prefix/bin/${expected})
    message(FATAL_ERROR "cmake --install did not install ${expected}")
  endif()
endforeach()
foreach(program ${programs})
  execute_process(COMMAND ${program} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "installed ${program} --help exited with ${rc}: ${out}${err}")
  endif()
  get_filename_component(name ${program} NAME)
  # The zeroshard programs print CLI11's usage; Google Benchmark's print its own.
  if(name MATCHES "^zeroshard-|^bench_nvme$")
    string(FIND "${out}" "Usage: ${name} [OPTIONS]" at)
  else()
    string(FIND "${out}" "--benchmark_filter" at)
  endif()
  if(at EQUAL -1)
    message(FATAL_ERROR "installed ${program} --help printed no usage:\n${out}")
  endif()
endforeach()
list(LENGTH programs count)
message(STATUS "${count} installed programs printed their --help")

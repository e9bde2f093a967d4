# Installs the built tree into a scratch prefix, then configures, builds and runs a tiny consumer
# project that uses find_package(zeroshard), and builds and runs the same program with the flags
# pkg-config gives — proof that both package descriptions are complete.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ZEROSHARD_BINARY_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix RESULT_VARIABLE rc)
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
execute_process(COMMAND ${CXX} -std=c++20 ${CONSUMER_SOURCE_DIR}/main.cpp ${pc_flag_list}
                        -o ${WORK_DIR}/consumer_pkg_config RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer with pkg-config's flags (${pc_flags}) failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${pc_libdir}
                        ${WORK_DIR}/consumer_pkg_config RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer built with pkg-config's flags exited with ${rc}")
endif()

# Configures zeroshard against two stand-ins for Torch: one whose set-up fails (AUTO must skip
# the adapter with one line, and the configure succeed) and one whose set-up changes CUDA
# variables (they must not reach libzeroshard's CUDA targets, and TORCH_CUDA_ARCH_LIST must follow
# CMAKE_CUDA_ARCHITECTURES). Run with -DSOURCE_DIR=... -DWORK_DIR=... -P run.cmake.
set(common -DZEROSHARD_BUILD_TESTS=OFF -DZEROSHARD_BUILD_EXAMPLES=OFF
           -DZEROSHARD_BUILD_BENCHMARKS=OFF -DZEROSHARD_INSTALL=OFF)

file(REMOVE_RECURSE ${WORK_DIR}/broken)
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/broken ${common}
          -DTorch_DIR=${CMAKE_CURRENT_LIST_DIR}/broken
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE error)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "a Torch whose set-up fails ended the configure:\n${output}\n${error}")
endif()
string(REGEX MATCHALL "[^\n]*libtorch adapter[^\n]*" lines "${output}")
list(LENGTH lines count)
if(NOT lines MATCHES "skipped: Your installed Caffe2 version uses CUDA" OR NOT lines MATCHES
   "adapter OFF")
  message(FATAL_ERROR "no line saying why the adapter was skipped: ${lines}")
endif()
if("${error}" MATCHES "Caffe2")
  message(FATAL_ERROR "Torch's error reached the configure's output:\n${error}")
endif()

file(REMOVE_RECURSE ${WORK_DIR}/polluting)
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/polluting ${common}
          -DTorch_DIR=${CMAKE_CURRENT_LIST_DIR}/polluting -DCMAKE_CUDA_ARCHITECTURES=86
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE error)
if(NOT result EQUAL 0 OR NOT output MATCHES "libtorch adapter ON")
  message(FATAL_ERROR "the stand-in Torch was not taken:\n${output}\n${error}")
endif()
if(NOT output MATCHES "CUDA backend ON")
  message(STATUS "no CUDA compiler: the CUDA half of this test has nothing to check")
  return()
endif()
file(READ ${WORK_DIR}/polluting/torch_cuda_arch_list.txt arch_list)
if(NOT arch_list STREQUAL "8.6")
  message(FATAL_ERROR "TORCH_CUDA_ARCH_LIST was '${arch_list}', expected '8.6' from "
                      "CMAKE_CUDA_ARCHITECTURES 86")
endif()
file(GLOB_RECURSE flag_files ${WORK_DIR}/polluting/CMakeFiles/zeroshard_objects.dir/flags.make)
file(READ ${flag_files} flags)
if(flags MATCHES "expt-relaxed-constexpr|ONNX_NAMESPACE")
  message(FATAL_ERROR "Torch's CUDA flags reached libzeroshard's kernels:\n${flags}")
endif()
if(NOT flags MATCHES "CUDA_FLAGS[^\n]*(arch=compute_86|sm_86)")
  message(FATAL_ERROR "libzeroshard's kernels lost their CUDA architectures:\n${flags}")
endif()

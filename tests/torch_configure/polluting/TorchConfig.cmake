# A Torch whose set-up does what Caffe2's CUDA set-up does to the scope it runs in, and records
# the TORCH_CUDA_ARCH_LIST it was given.
file(WRITE "${CMAKE_BINARY_DIR}/torch_cuda_arch_list.txt" "$ENV{TORCH_CUDA_ARCH_LIST}")
set(CMAKE_CUDA_ARCHITECTURES OFF)
string(APPEND CMAKE_CUDA_FLAGS " --expt-relaxed-constexpr -DONNX_NAMESPACE=onnx_torch")
if(NOT TARGET torch)
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_CURRENT_LIST_DIR})
endif()
set(TORCH_LIBRARIES torch)
set(Torch_FOUND TRUE)

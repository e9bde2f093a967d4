# A Torch whose set-up cannot finish, as a CUDA wheel's without a CUDA toolkit.
message(FATAL_ERROR "Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries")

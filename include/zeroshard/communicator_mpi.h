// Communicator::from_mpi, for programs that already use MPI: the one public header that includes
// <mpi.h>.
#pragma once

#include <mpi.h>

#include <memory>

#include "zeroshard/communicator.h"

namespace zeroshard {

template <>
inline std::unique_ptr<Communicator> Communicator::from_mpi<MPI_Comm>(MPI_Comm comm) {
  return from_mpi_handle(static_cast<int>(MPI_Comm_c2f(comm)));
}

}  // namespace zeroshard

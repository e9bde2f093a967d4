// Communicator::from_mpi, for programs that already use MPI: the one public header that includes
// <mpi.h>.
#pragma once

#include <mpi.h>

#include <memory>

#include "zeroshard/communicator.h"

namespace zeroshard {

namespace detail {
/// from_mpi's implementation. The communicator crosses the library's interface as its Fortran
/// handle (MPI_Comm_c2f), an integer in every MPI, so that the library's symbols do not depend on
/// how this MPI defines MPI_Comm.
std::unique_ptr<Communicator> communicator_from_mpi_handle(int fortran_handle);
}  // namespace detail

template <>
inline std::unique_ptr<Communicator> Communicator::from_mpi<MPI_Comm>(MPI_Comm comm) {
  return detail::communicator_from_mpi_handle(static_cast<int>(MPI_Comm_c2f(comm)));
}

}  // namespace zeroshard

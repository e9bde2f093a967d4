// This process's MPI runtime: initialised lazily on first use, finalized once at process exit,
// and the datatypes and reduction ops zeroshard registers for its element types.
#pragma once

#include <mpi.h>

#include <string>

#include "zeroshard/communicator.h"
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// The one per-process MPI state. Lives in a function-local static: constructed by the first
/// instance() call, destroyed at exit after every communicator made since (statics are destroyed
/// in reverse order of construction), and its destructor finalizes MPI unless the program already
/// did.
class MpiRuntime {
 public:
  /// Initialises MPI on the first call (unless the program already did); throws CommError.
  static MpiRuntime& instance();

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  MPI_Datatype datatype(DType dtype) const noexcept;
  MPI_Op op(DType dtype, ReduceOp op) const noexcept;

 private:
  MpiRuntime();
  ~MpiRuntime();

  // fp16 and bf16 travel as opaque 2-byte elements; their ops know which format they reduce.
  MPI_Datatype two_bytes_ = MPI_DATATYPE_NULL;
  /// MPI is finalized at exit only when zeroshard initialised it: a program that did is the one
  /// to finalize it, when it is done with MPI.
  bool initialized_here_ = false;
  MPI_Op fp16_sum_ = MPI_OP_NULL;
  MPI_Op fp16_max_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
};

/// True once MPI_Finalize has run; handles destroyed after that must not call MPI.
bool mpi_finalized() noexcept;

/// MPI's description of a return code, e.g. "MPI_ERR_TRUNCATE: message truncated".
std::string mpi_error_string(int code);

}  // namespace zeroshard::detail

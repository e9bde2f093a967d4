// MPI initialisation and finalization for the whole process, and the user-defined datatype and
// reduction ops that let MPI reduce fp16 and bf16 (which it has no types for).
#include "comm/mpi_runtime.h"

#include "comm/elementwise_reduce.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {
namespace {

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    throw CommError(ErrorCode::kMpi,
                    std::string(call) + " failed during MPI start-up: " + mpi_error_string(rc));
  }
}

// An MPI_User_function: inout[i] = in[i] (op) inout[i], the same reduction as the ring's.
template <DType kDType, ReduceOp kOp>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(in, inout, *len, kDType, kOp);
}

}  // namespace

MpiRuntime& MpiRuntime::instance() {
  static MpiRuntime runtime;
  return runtime;
}

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    if (mpi_finalized()) {
      throw CommError(ErrorCode::kMpi,
                      "MPI was already finalized in this process; a communicator must be created "
                      "before MPI_Finalize");
    }
    // Requests may be waited on from another thread than the one that started them, so ask for
    // the most MPI offers. Any level MPI grants works as long as the program waits on requests
    // from the thread that made them, which is all FUNNELED (or SINGLE in practice) allows.
    int provided = MPI_THREAD_SINGLE;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    initialized_here_ = true;
    // Errors not tied to one of our communicators (datatype and op creation) are raised on
    // MPI_COMM_WORLD; we initialised MPI, so its handler is ours to choose.
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
  }
  check_mpi(MPI_Type_contiguous(2, MPI_BYTE, &two_bytes_), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&two_bytes_), "MPI_Type_commit");
  constexpr int kCommutative = 1;
  check_mpi(MPI_Op_create(&reduce_16bit<DType::kFloat16, ReduceOp::kSum>, kCommutative, &fp16_sum_),
            "MPI_Op_create");
  check_mpi(MPI_Op_create(&reduce_16bit<DType::kFloat16, ReduceOp::kMax>, kCommutative, &fp16_max_),
            "MPI_Op_create");
  check_mpi(
      MPI_Op_create(&reduce_16bit<DType::kBFloat16, ReduceOp::kSum>, kCommutative, &bf16_sum_),
      "MPI_Op_create");
  check_mpi(
      MPI_Op_create(&reduce_16bit<DType::kBFloat16, ReduceOp::kMax>, kCommutative, &bf16_max_),
      "MPI_Op_create");
}

MpiRuntime::~MpiRuntime() {
  // The program may have finalized MPI itself; then every handle is already gone.
  if (mpi_finalized()) return;
  for (MPI_Op* op : {&fp16_sum_, &fp16_max_, &bf16_sum_, &bf16_max_}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  if (two_bytes_ != MPI_DATATYPE_NULL) MPI_Type_free(&two_bytes_);
  if (initialized_here_ && MPI_Finalize() != MPI_SUCCESS) {
    ZEROSHARD_LOG(kError, "MPI_Finalize failed");
  }
}

MPI_Datatype MpiRuntime::datatype(DType dtype) const noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16:
      break;
  }
  return two_bytes_;
}

MPI_Op MpiRuntime::op(DType dtype, ReduceOp op) const noexcept {
  const bool max = op == ReduceOp::kMax;
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
      return max ? MPI_MAX : MPI_SUM;
    case DType::kFloat16:
      return max ? fp16_max_ : fp16_sum_;
    case DType::kBFloat16:
      return max ? bf16_max_ : bf16_sum_;
  }
  return MPI_OP_NULL;
}

bool mpi_finalized() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length)) + " (code " + std::to_string(code) +
         ")";
}

}  // namespace zeroshard::detail

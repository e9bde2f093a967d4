// GoogleTest main for the distributed tests: every rank runs every test, and only rank 0 prints
// the per-test lines so the log stays readable. A failure on any rank fails the mpirun exit code.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "zeroshard/device.h"

namespace {

// Prints only failed assertions, tagged with the rank, for ranks other than 0.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// CTest reports this exit code as a skipped test (SKIP_RETURN_CODE in tests/CMakeLists.txt).
constexpr int kSkipped = 77;

}  // namespace

int main(int argc, char** argv) {
  // The gpu-labelled copies of the engine tests ask for the CUDA backend; without a GPU they
  // are skipped, saying why, rather than passed on the CPU.
  const char* device = std::getenv("ZEROSHARD_TEST_DEVICE");
  if (device != nullptr && std::string_view(device) == "cuda" && !zeroshard::cuda_available()) {
    if (launcher_rank() == 0) {
      std::printf("SKIPPED: ZEROSHARD_TEST_DEVICE=cuda but no GPU is usable: %s\n",
                  zeroshard::cuda_unavailable_reason().c_str());
    }
    return kSkipped;
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (int rank = launcher_rank(); rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}

// GoogleTest main for the distributed tests: every rank runs every test, and only rank 0 prints
// the per-test lines so the log stays readable. A failure on any rank fails the mpirun exit code.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (launcher_rank() != 0) {
    // Failures on other ranks are still printed: only the success chatter is removed.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ::testing::EmptyTestEventListener);
  }
  return RUN_ALL_TESTS();
}

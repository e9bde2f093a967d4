// The host team: a scope sets it for its thread and restores it; the share of a rank's cores
// counts the cores its affinity mask gives it, divided among its host's ranks when they share
// the whole machine.
#include "util/cpu_team.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

namespace zeroshard::detail {
namespace {

TEST(CpuTeam, AScopeSetsTheTeamOfItsThreadAndRestoresIt) {
  const int outside = cpu_team_size();
  EXPECT_GE(outside, 1);
  {
    const CpuTeamScope outer(97);
    EXPECT_EQ(cpu_team_size(), 97);
    {
      const CpuTeamScope unchanged(0);
      EXPECT_EQ(cpu_team_size(), 97);
      const CpuTeamScope five(5);
      EXPECT_EQ(cpu_team_size(), 5);
    }
    EXPECT_EQ(cpu_team_size(), 97);
    int other_thread = 0;
    std::thread([&other_thread] { other_thread = cpu_team_size(); }).join();
    EXPECT_NE(other_thread, 97) << "a scope sets its own thread's team only";
  }
  EXPECT_EQ(cpu_team_size(), outside);
}

TEST(CpuTeam, RankCoresDivideAWholeMachineAmongItsRanks) {
  EXPECT_EQ(rank_cores(16, 16, 1), 16);
  EXPECT_EQ(rank_cores(16, 16, 4), 4);
  EXPECT_EQ(rank_cores(16, 16, 3), 5);
  EXPECT_EQ(rank_cores(2, 2, 4), 1);
  // Bound to cores of its own: the mask is the rank's already.
  EXPECT_EQ(rank_cores(4, 16, 4), 4);
  EXPECT_EQ(rank_cores(0, 16, 1), 1);
}

TEST(CpuTeam, TheShareOfTheRanksCoresIsAtLeastOneThread) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr) {
    GTEST_SKIP() << "OMP_NUM_THREADS is set, which gives the team instead of the share";
  }
  const CpuTeam whole = cpu_team_for_share(1.0);
  ASSERT_GE(whole.rank_cores, 1);
  EXPECT_EQ(whole.size, whole.rank_cores);
  const CpuTeam half = cpu_team_for_share(0.5);
  EXPECT_EQ(half.size, std::max(1, static_cast<int>(std::floor(0.5 * half.rank_cores))));
  EXPECT_NE(half.description.find("cpuadam_cores_perc 0.5 of " + std::to_string(half.rank_cores) +
                                  " cores"),
            std::string::npos)
      << half.description;
  EXPECT_EQ(cpu_team_for_share(1e-9).size, 1);
}

}  // namespace
}  // namespace zeroshard::detail

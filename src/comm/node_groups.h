// ZeRO++'s node groups: the data-parallel ranks split into groups of K ranks that share a host,
// with one communicator inside each group and one across the groups, for the hierarchical
// partition of parameters (hpZ) and the two-hop quantized gradient reduction (qgZ).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zeroshard/communicator.h"

namespace zeroshard::detail {

struct NodeGroups {
  int group_size = 1;   ///< K, ranks per group
  int group_count = 1;  ///< world / K
  int group = 0;        ///< this rank's group
  int index = 0;        ///< this rank's place in its group
  /// members[g][i]: the world rank at place i of group g.
  std::vector<std::vector<int>> members;
  /// The K ranks of this rank's group, ranked by place.
  std::unique_ptr<Communicator> within;
  /// The ranks at this rank's place in every group, one per group, ranked by group.
  std::unique_ptr<Communicator> across;
};

/// The name of this rank's host: ZEROSHARD_HOST_NAME where set (for launchers whose hosts share
/// one name), else gethostname().
std::string this_host_name();

/// Collective over `world`: groups of `group_size` ranks of one host, in rank order within each
/// host and hosts in the order of their lowest rank; `group_size` 0 groups every rank of a host.
/// Throws ConfigError under `key` when `group_size` does not divide some host's count of ranks,
/// since a group would then span hosts, or, for 0, when the hosts run different counts of ranks.
NodeGroups make_node_groups(Communicator& world, int group_size, const std::string& key);

}  // namespace zeroshard::detail

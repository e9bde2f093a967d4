// Node groups from the host names the ranks report.
#include "comm/node_groups.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <sstream>

#include "util/check.h"

namespace zeroshard::detail {

std::string this_host_name() {
  if (const char* name = std::getenv("ZEROSHARD_HOST_NAME"); name != nullptr && *name != '\0') {
    return name;
  }
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

NodeGroups make_node_groups(Communicator& world, int group_size, const std::string& key) {
  ZEROSHARD_CHECK_USAGE(group_size >= 0, key << ": got " << group_size << ", expected >= 0");
  const std::vector<std::string> hosts = world.all_gather_text(this_host_name());
  // Hosts in the order of their lowest rank, each with its ranks in order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks_of;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    auto& ranks = ranks_of[hosts[r]];
    if (ranks.empty()) order.push_back(hosts[r]);
    ranks.push_back(r);
  }
  if (group_size == 0) {
    // Every rank of a host: the hosts must run equally many, or the groups would differ in size
    // and the ranks at one place would not form one group per host.
    const std::size_t per_host = ranks_of[order.front()].size();
    for (const std::string& host : order) {
      if (ranks_of[host].size() == per_host) continue;
      std::ostringstream os;
      os << "groups of every rank of a host need the same number of ranks on each host, but host '"
         << order.front() << "' runs " << per_host << " and host '" << host << "' runs "
         << ranks_of[host].size() << "; start as many ranks on every host";
      throw ConfigError(key, os.str());
    }
    group_size = static_cast<int>(per_host);
  }
  NodeGroups groups;
  groups.group_size = group_size;
  for (const std::string& host : order) {
    const std::vector<int>& ranks = ranks_of[host];
    if (ranks.size() % static_cast<std::size_t>(group_size) != 0) {
      std::ostringstream os;
      os << "got " << group_size << ", but host '" << host << "' runs " << ranks.size()
         << " rank(s) (";
      for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
      os << "), which do not form groups of " << group_size
         << " on one host; set it to a divisor of the ranks per host (DeepSpeed users set the "
            "GPUs per node), or 1 to turn it off";
      throw ConfigError(key, os.str());
    }
    for (std::size_t first = 0; first < ranks.size(); first += group_size) {
      groups.members.emplace_back(ranks.begin() + static_cast<std::ptrdiff_t>(first),
                                  ranks.begin() + static_cast<std::ptrdiff_t>(first + group_size));
    }
  }
  groups.group_count = static_cast<int>(groups.members.size());
  for (int g = 0; g < groups.group_count; ++g) {
    for (int i = 0; i < group_size; ++i) {
      if (groups.members[g][i] == world.rank()) {
        groups.group = g;
        groups.index = i;
      }
    }
  }
  groups.within = world.split(groups.group, groups.index);
  groups.across = world.split(groups.index, groups.group);
  return groups;
}

}  // namespace zeroshard::detail

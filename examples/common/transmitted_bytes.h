// The bytes a network interface has sent, from /proc/net/dev: what the multi-host tests and the
// wire benchmarks count per phase or per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace zeroshard::examples {

/// `interface`'s transmitted bytes (/proc/net/dev lists "IF: rx_bytes ... (8 fields) tx_bytes"),
/// or -1 when the interface is not there.
inline std::int64_t transmitted_bytes(const std::string& interface) {
  std::ifstream dev("/proc/net/dev");
  std::string line;
  while (std::getline(dev, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::size_t name = line.find_first_not_of(' ');
    if (line.substr(name, colon - name) != interface) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::int64_t value = 0;
    for (int field = 0; field < 9; ++field) fields >> value;  // the 9th is tx_bytes
    return value;
  }
  return -1;
}

}  // namespace zeroshard::examples

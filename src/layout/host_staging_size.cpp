// The staging half: the larger of a reduced share and one write-back.
#include "layout/host_staging_size.h"

#include <algorithm>

namespace zeroshard::detail {

std::int64_t host_staging_half_bytes(std::int64_t share_bytes, bool writes_back, std::int64_t owned,
                                     std::int64_t sub_group_size, std::int64_t element_bytes) {
  const std::int64_t write_back =
      writes_back ? element_bytes * std::min({owned, sub_group_size, kWriteBackElements}) : 0;
  return std::max(share_bytes, write_back);
}

}  // namespace zeroshard::detail

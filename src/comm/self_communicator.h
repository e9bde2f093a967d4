// The world of one that Communicator::from_environment returns when no MPI launcher started the
// process.
#pragma once

#include <memory>

#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// Rank 0 of 1, backend "self"; needs no MPI.
std::unique_ptr<Communicator> make_self_communicator();

}  // namespace zeroshard::detail

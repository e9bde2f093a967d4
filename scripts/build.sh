#!/usr/bin/env bash
# Configures and builds zeroshard into build/ (optimised, with debug info). Extra arguments go to
# the configure step, e.g. scripts/build.sh -DZEROSHARD_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j"$(nproc)"

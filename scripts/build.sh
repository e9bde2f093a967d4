#!/usr/bin/env bash
# Configures and builds zeroshard into build/ (optimised, with debug info). Extra arguments go to
# the configure step, e.g. scripts/build.sh -DZEROSHARD_CUDA=OFF; ZEROSHARD_BUILD_TARGETS names the
# targets to build (default: all of them).
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a targets <<<"${ZEROSHARD_BUILD_TARGETS:-all}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j"$(nproc)" --target "${targets[@]}"

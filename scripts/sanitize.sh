#!/usr/bin/env bash
# Builds everything with AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/ (CPU
# only) and runs the whole test suite there; any sanitizer report fails its test. Extra arguments
# go to ctest, e.g. scripts/sanitize.sh -R '^mpi_engine_lifetime_test_np.$' for a subset.
# ZEROSHARD_SANITIZE_BUILD_DIR names another build folder; ZEROSHARD_BUILD_JOBS and
# ZEROSHARD_TEST_JOBS the parallelism of the build (default: every core) and of ctest (default 2).
# Times on 2 cores: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${ZEROSHARD_SANITIZE_BUILD_DIR:-build-asan}
# -fno-sanitize-recover: a UBSan report ends the program even where a test starts a program with
# an environment of its own (UBSAN_OPTIONS below does the same for every other case).
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
# -O1, not Debug's -O0: what AddressSanitizer's documentation advises for usable speed, while
# -O2's inlining and tail calls leave a report's stack with fewer of the frames that led to the
# error. Every test gets four times its limit: on a loaded machine a sanitized test ran 78x as long
# as in the release build the limits were set for (docs/testing.md).
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEROSHARD_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$sanitizers -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" -DCMAKE_SHARED_LINKER_FLAGS="$sanitizers" \
  -DZEROSHARD_TEST_TIMEOUT_SCALE=4
cmake --build "$build_dir" -j"${ZEROSHARD_BUILD_JOBS:-$(nproc)}"

# detect_leaks=0: OpenMPI leaks its own allocations at MPI_Finalize, from plugins it has already
# unloaded, so LeakSanitizer can neither name nor suppress them and every MPI test would fail.
export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$build_dir" --output-on-failure -j"${ZEROSHARD_TEST_JOBS:-2}" "$@"

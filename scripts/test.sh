#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. MPI cases declare how many
# processes they start (ctest's PROCESSORS), so -j2 never runs more at once than two cores take.
# Then the libtorch adapter again against the PyPI wheel's libtorch 2.x (scripts/test_torch2.sh),
# and, with that wheel, the comparison with DeepSpeed and FSDP2 as a plumbing check
# (scripts/test_compare_peers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
# ccache keyed without the build folder: build-torch2/ compiles none of libzeroshard again.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
           -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
bash scripts/build.sh "${launchers[@]}"
status=0
ctest --test-dir build --output-on-failure -j2 || status=$?
bash scripts/test_torch2.sh "${launchers[@]}" || status=$?
bash scripts/test_compare_peers.sh || status=$?
exit "$status"

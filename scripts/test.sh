#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. MPI cases declare how many
# processes they start (ctest's PROCESSORS), so -j2 never runs more at once than two cores take.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2

#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages zeroshard builds and tests with, only those missing; quick
# and silent when everything is present. Uses sudo only when not already root.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  ccache  # scripts/test.sh: build-torch2/ reuses build/'s libzeroshard objects
  liburing-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev  # every program's command line
  libtorch-dev  # zeroshard::torch, the libtorch adapter (1.13, CPU), its tests and example
  gnuplot-nox
  fio  # benchmarks/run_bench_nvme.sh: the swapper's baseline
  iproute2  # ip netns: the multi-host tests' test hosts
  python3-dev  # scripts/test_compare_peers.sh: DeepSpeedCPUAdam compiles against Python.h
)

# The tensorboard test reads the monitors' event files with TensorBoard's own reader, from PyPI.
if command -v python3 >/dev/null && ! python3 -c "import tensorboard" 2>/dev/null; then
  echo "install_deps.sh: pip install tensorboard"
  python3 -m pip install --quiet tensorboard ||
    python3 -m pip install --quiet --break-system-packages tensorboard ||
    echo "install_deps.sh: could not install tensorboard; example_mlp_monitor_tensorboard skips"
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$package")
  fi
done
# CI installs the whole list every time (apt-get update first), so that a package installed by
# hand on the machine can never hide a missing one; elsewhere only what is missing.
if [[ "${CI:-}" == "true" ]]; then
  missing=("${packages[@]}")
elif ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi
echo "install_deps.sh: installing ${missing[*]}"
"${sudo[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

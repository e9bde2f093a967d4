#!/usr/bin/env bash
# Downloads the Debian packages that zeroshard builds and tests with into a folder (default
# .deps-bundle/), for a machine that cannot reach a package registry: scripts/gpu-check.sh unpacks
# them there (ZEROSHARD_DEPS_BUNDLE=folder) without overwriting a file the machine already has.
# Run it on a Debian or Ubuntu machine of the same architecture that can reach one.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=${1:-.deps-bundle}
# The libraries install_deps.sh installs, with the shared libraries they need at run time that a
# CUDA image does not ship; compilers, CMake and the C library are the machine's own.
packages=(
  liburing-dev liburing2 nlohmann-json3-dev
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libhwloc15 libhwloc-plugins libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-2.1-7 libpmix2
  libfabric1 libibverbs1 librdmacm1 libucx0 libpsm2-2 libpsm-infinipath1 libnl-3-200
  libnl-route-3-200 libnuma1 libmunge2 libpciaccess0 libxnvctrl0
  libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5
  libquadmath0
  libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian
  libcli11-dev
)

rm -rf "$bundle"
mkdir -p "$bundle"
(cd "$bundle" && apt-get download "${packages[@]}")

# update-alternatives makes links such as /usr/bin/mpirun and libopenblas.so when a package is
# installed, which unpacking alone does not: record the ones that lead into these packages.
owned=$(for deb in "$bundle"/*.deb; do dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\.||; s|/$||'; done)
for link in $(find /usr/bin /usr/lib/x86_64-linux-gnu /usr/include -maxdepth 3 \
                -lname '/etc/alternatives/*' 2>/dev/null); do
  # The alternative's choice, not the file at the end of its links: a wrapper such as
  # mpicxx.openmpi finds its settings by the name it was called by.
  target=$(readlink "$(readlink "$link")")
  if grep -qxF "$target" <<<"$owned"; then
    echo "$link $target"
  fi
done >"$bundle/links.txt"
echo "bundle_deps.sh: $(ls "$bundle"/*.deb | wc -l) packages, $(du -sh "$bundle" | cut -f1)," \
  "$(wc -l <"$bundle/links.txt") alternative links in $bundle"

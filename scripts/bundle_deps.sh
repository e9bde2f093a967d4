#!/usr/bin/env bash
# Downloads the Debian packages that zeroshard builds and tests with into a folder (default
# .deps-bundle/), for a machine that cannot reach a package registry: scripts/gpu-check.sh unpacks
# them there (ZEROSHARD_DEPS_BUNDLE=folder) without overwriting a file the machine already has.
# Run it on a Debian or Ubuntu machine of the same architecture that can reach one.
#
# Beside them, in wheels/: DeepSpeed's wheel, built from PyPI's sdist, and the wheels it needs but
# PyTorch's own, for the machine's preinstalled PyTorch and the comparison with DeepSpeed and FSDP2
# (benchmarks/compare_peers). ZEROSHARD_BUNDLE_PYTHON: a Python with torch to build the wheel
# (default build-torch2/venv/bin/python, scripts/test_torch2.sh's);
# ZEROSHARD_BUNDLE_PYTHON_VERSIONS: the machine's Python versions, for the dependencies' binary
# wheels (default 3.12).
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

deepspeed=${ZEROSHARD_DEEPSPEED:-deepspeed==0.19.8}
python=${ZEROSHARD_BUNDLE_PYTHON:-build-torch2/venv/bin/python}
wheels="$bundle/wheels"
if "$python" -c "import torch" 2>/dev/null; then
  mkdir -p "$wheels"
  # The sdist's setup.py imports torch, so it builds with this Python's, not an isolated one.
  "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --wheel-dir "$wheels" "$deepspeed"
  # Its requirements less extras, torch and what a PyTorch image has beside it: triton, the
  # nvidia-* libraries and numpy (16 MB, which the run's mlp_task.py needs too).
  mapfile -t requirements < <("$python" - "$wheels"/deepspeed-*.whl <<'EOF'
import re, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")))
for line in metadata.decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        requirement = line.split(": ", 1)[1]
        if not re.match(r"(torch|nvidia|triton|numpy)\b", requirement):
            print(requirement)
EOF
  )
  for version in ${ZEROSHARD_BUNDLE_PYTHON_VERSIONS:-3.12}; do
    "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
      --dest "$wheels" --python-version "$version" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 "${requirements[@]}"
  done
  echo "bundle_deps.sh: $(ls "$wheels"/*.whl | wc -l) wheels, $(du -sh "$wheels" | cut -f1)," \
    "for $deepspeed in $wheels"
else
  echo "bundle_deps.sh: no torch in $python (scripts/test_torch2.sh installs it there): DeepSpeed" \
    "is not bundled, and scripts/gpu-check.sh will skip the comparison with it" >&2
fi
echo "bundle_deps.sh: $(ls "$bundle"/*.deb | wc -l) packages, $(du -sh "$bundle" | cut -f1)," \
  "$(wc -l <"$bundle/links.txt") alternative links in $bundle"

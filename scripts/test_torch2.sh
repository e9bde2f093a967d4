#!/usr/bin/env bash
# The libtorch adapter, its tests and the torch examples against the PyPI torch wheel's libtorch
# (2.x, its CUDA build, so the adapter's CUDA branch compiles and links), beside build/'s Debian
# libtorch 1.13: into build-torch2/, then `ctest -L torch` there on the CPU. The wheel goes into a
# venv in build-torch2/, kept while it is the version asked for. Extra arguments go to the
# configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build-torch2
# Pinned, so that a new wheel on PyPI cannot change CI under a commit; raise it on purpose.
wheel=${ZEROSHARD_TORCH2_WHEEL:-torch==2.15.0}
venv=$build/venv

installed=$("$venv/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" \
  2>/dev/null || true)
if [[ "$installed" != "$wheel" ]]; then
  echo "test_torch2.sh: pip install $wheel into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  # A registry that cannot be reached skips this check loudly rather than failing the suite
  # that already passed; a wheel that installs and then fails to build or test fails it.
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"; then
    echo "test_torch2.sh: SKIPPED: could not install $wheel from PyPI; the adapter was not built" \
      "against libtorch 2.x" >&2
    exit 0
  fi
fi

# The wheel's cmake prefix, as the project's configure would find it with the venv's python first
# on PATH; ZEROSHARD_CUDA=ON: the CUDA libtorch's branch of the adapter must build here.
prefix=$("$venv/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix" \
  -DZEROSHARD_CUDA=ON -DZEROSHARD_WITH_TORCH=ON "$@"
if ! grep -q ZEROSHARD_TORCH_CUDA=1 "$build/compile_commands.json"; then
  echo "test_torch2.sh: the adapter was configured without its CUDA branch" >&2
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target zeroshard_torch_all
ctest --test-dir "$build" -L torch --output-on-failure -j2

#!/usr/bin/env bash
# The comparison with DeepSpeed and FSDP2 (benchmarks/compare_peers) as a plumbing check on the
# CPU: a few steps of the small MLP on 2 ranks, each framework once, DeepSpeed on its CPU
# accelerator over gloo. Fails when a framework errors or its first losses are not zeroshard's;
# skips loudly when PyPI cannot be reached. Uses the torch wheel scripts/test_torch2.sh put in
# build-torch2/venv (run it first) and installs DeepSpeed from its sdist into that venv.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=build-torch2/venv
# Pinned for the same reason as test_torch2.sh's wheel; scripts/bundle_deps.sh bundles this one.
deepspeed=${ZEROSHARD_DEEPSPEED:-deepspeed==0.19.8}
trainer=build/examples/mlp/zeroshard-train-mlp

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "test_compare_peers.sh: SKIPPED: no torch in $venv (scripts/test_torch2.sh installs it)" >&2
  exit 0
fi
installed=$("$venv/bin/python" -c "import deepspeed; print('deepspeed==' + deepspeed.__version__)" \
  2>/dev/null || true)
if [[ "$installed" != "$deepspeed" ]]; then
  echo "test_compare_peers.sh: pip install $deepspeed into $venv"
  # The sdist's setup.py imports torch: it builds against the venv's, not an isolated one.
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
    setuptools wheel "$deepspeed"; then
    echo "test_compare_peers.sh: SKIPPED: could not install $deepspeed from PyPI; zeroshard was" \
      "not compared with DeepSpeed and FSDP2" >&2
    exit 0
  fi
fi

# DeepSpeedCPUAdam compiles on first use, with the ninja DeepSpeed installs into the venv; its
# build is kept beside the venv, not in ~/.cache.
export PATH=$PWD/$venv/bin:$PATH
export TORCH_EXTENSIONS_DIR=$PWD/build-torch2/torch_extensions
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
"$venv/bin/python" benchmarks/compare_peers/compare.py --device cpu --ranks 2 --steps 3 \
  --rounds 1 --check-losses 3 --strict --trainer "$trainer" --python "$venv/bin/python"

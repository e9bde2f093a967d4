#!/usr/bin/env bash
# The demo: installs what is missing, builds, and trains the example MLP with ZeRO stage 3 on 4
# ranks; the program prints loss, speed and memory per step and every rank's memory report.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
# Only what the demo runs: the library, the trainer and the tools beside it (scripts/test.sh
# builds the rest).
ZEROSHARD_BUILD_TARGETS="zeroshard zeroshard-train-mlp zeroshard-config zeroshard-estimate" \
  bash scripts/build.sh

# --oversubscribe and --bind-to none let 4 ranks share fewer cores, and one BLAS thread per rank
# keeps them from fighting over those cores; containers often forbid the single-copy (CMA) path.
mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np 4 -x OPENBLAS_NUM_THREADS=1 \
  build/examples/mlp/zeroshard-train-mlp --config examples/configs/zero3.json --steps 30 \
  --device cpu

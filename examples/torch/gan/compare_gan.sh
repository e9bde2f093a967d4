#!/bin/bash
# The GAN example against its torch::optim twin: zeroshard's losses on 1 rank, at stages 0-3,
# equal the twin's within the tolerance of docs/torch.md over the first 8 steps; on 2 ranks every
# stage gives stage 0's losses within it. Past step 7 the adversarial game amplifies the update's
# last-bit differences from torch's AdamW, up to 20 times a step, how soon depending on the CPU, the
# libtorch and OMP_NUM_THREADS (docs/torch.md has the figures), so a longer window fails by
# chance. Then 100 steps on 2 ranks at stages 0 and 3 must bring the fakes closer to the ring (the
# program's exit status).
# Usage: compare_gan.sh TWIN ZEROSHARD CONFIG_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
twin=$1 zeroshard=$2 configs=$3
shift 3
steps=8
tolerance=1e-4  # relative, on each printed loss
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Lines "step S: loss_d D loss_g G distance X" of two runs, at most `tolerance` apart.
same_losses() {
  paste -d' ' <(grep '^step ' "$1") <(grep '^step ' "$2") | awk -v tol="$tolerance" -v what="$3" '
    function off(a, b) { d = a - b; if (d < 0) d = -d; return d > tol * (1 + (a < 0 ? -a : a)) }
    { if ($4 == "" || off($4, $12) || off($6, $14) || off($8, $16)) {
        printf "%s differs at %s %s: %s\n", what, $1, $2, $0; bad = 1 } }
    END { if (NR == 0) { print what ": no output"; bad = 1 } exit bad }'
}

"$twin" - "$steps" > "$work/twin.txt"
for stage in 0 1 2 3; do
  "$@" -np 1 "$zeroshard" "$configs/gan_zero$stage.json" "$steps" > "$work/np1_$stage.txt" || true
  same_losses "$work/twin.txt" "$work/np1_$stage.txt" "1 rank, stage $stage"
  "$@" -np 2 "$zeroshard" "$configs/gan_zero$stage.json" "$steps" > "$work/np2_$stage.txt" || true
  same_losses "$work/np2_0.txt" "$work/np2_$stage.txt" "2 ranks, stage $stage"
done
for stage in 0 3; do
  "$@" -np 2 "$zeroshard" "$configs/gan_zero$stage.json" 100 > "$work/learns_$stage.txt"
done
echo "GAN: zeroshard at stages 0-3 equals torch::optim within $tolerance"

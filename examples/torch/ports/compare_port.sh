#!/bin/bash
# One of PyTorch's C++ examples ported to zeroshard (docs/torch.md, "Three public examples,
# ported"): the diff between its torch::optim twin and the port may not have more `-` and `+`
# lines than docs/torch.md's table allows it, and the port's printed losses equal the twin's
# within the table's tolerance (relative) on 1 rank at stages 0-3; on 2 ranks, where each rank
# trains on its share and rank 0 prints its own share's losses, every stage's equal stage 0's
# within the same.
# Usage: compare_port.sh NAME TWIN PORT PORTS_DIR DOCS MAKE_MNIST_IDX MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
name=$1 twin=$2 port=$3 ports=$4 docs=$5 make_mnist_idx=$6
shift 6
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The table's row "| `NAME` | ... | ... | BUDGET | TOLERANCE | ... |" holds what CI holds it to.
row() { awk -F'|' -v name=" \`$name\` " -v column="$1" '$2 == name { print $column }' "$docs"; }
budget=$(row 5 | tr -dc 0-9)
tolerance=$(row 6 | tr -d ' `')
lines=$(diff "$ports/${name}_torch_optim.cpp" "$ports/${name}_zeroshard.cpp" | grep -c '^[<>]' ||
  true)
if [[ -z $budget || -z $tolerance ]]; then
  echo "$name: $docs states no diff budget or tolerance for it"
  exit 1
fi
if ((lines > budget)); then
  echo "$name: the port's diff has $lines lines, more than the $budget docs/torch.md allows"
  exit 1
fi

args=()
if [[ $name != regression ]]; then
  "$make_mnist_idx" "$work/data"
  args=("$work/data")
fi

# Line by line: numbers within `tolerance` (relative), every other word equal.
same_output() {
  awk -v tol="$tolerance" -v what="$3" '
    function number(s) { return s ~ /^[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$/ }
    function off(a, b) { d = a - b; if (d < 0) d = -d; return d > tol * (1 + (a < 0 ? -a : a)) }
    NR == FNR { want[FNR] = $0; n = FNR; next }
    { m = FNR; na = split(want[FNR], a); nb = split($0, b); differs = na != nb
      for (i = 1; i <= na && !differs; ++i)
        differs = number(a[i]) && number(b[i]) ? off(a[i] + 0, b[i] + 0) : a[i] != b[i]
      if (differs) { printf "%s differs at line %d:\n  %s\n  %s\n", what, FNR, want[FNR], $0; bad = 1 } }
    END { if (m != n || n == 0) { printf "%s: %d lines against %d\n", what, m, n; bad = 1 }
          exit bad }' "$1" "$2"
}

# The port on RANKS ranks at STAGE; rank r's output in $work/npRANKS_STAGE.r.
run_port() {
  local ranks=$1 stage=$2
  sed "s/\"stage\": [0-3]/\"stage\": $stage/" "$ports/$name.json" > "$work/zero$stage.json"
  if ! "${mpiexec[@]}" -np "$ranks" bash -c \
    'exec "$@" > "$0.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"' "$work/np${ranks}_$stage" \
    "$port" "${args[@]}" "$work/zero$stage.json"; then
    echo "$name: the port failed on $ranks ranks at stage $stage"
    exit 1
  fi
}

"$twin" "${args[@]}" > "$work/twin.txt"
for stage in 0 1 2 3; do
  run_port 1 "$stage"
  same_output "$work/twin.txt" "$work/np1_$stage.0" "$name, 1 rank, stage $stage"
  run_port 2 "$stage"
  same_output "$work/np2_0.0" "$work/np2_$stage.0" "$name, 2 ranks, stage $stage"
done
echo "$name: a $lines-line port (budget $budget); stages 0-3 equal torch::optim within $tolerance"

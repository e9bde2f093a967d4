#!/usr/bin/env bash
# What csv_monitor and tensorboard cost: the MLP example on 2 ranks with both monitors on and
# off, alternating for --rounds rounds (a shared machine's noise hits both alike); prints each
# round's mean milliseconds per step (the example's "ms/step", steps after the first 5), the
# whole run's wall time and the CPU time of both ranks (user + system, from /usr/bin/time: on a
# loaded machine the steadier measure of what the monitors cost), then the medians and on/off.
# usage: benchmarks/run_monitor_overhead.sh [--build DIR] [--rounds 5] [--steps 200] [--width 256]
set -euo pipefail

build=build
rounds=5
steps=200
width=256
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --width) width=$2; shift 2 ;;
    *) echo "run_monitor_overhead.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
program="$build/examples/mlp/zeroshard-train-mlp"
[[ -x "$program" ]] || { echo "run_monitor_overhead.sh: $program missing; build it" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$(dirname "$0")/../examples/configs/zero2.json
python3 - "$base" "$work" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
json.dump(config, open(sys.argv[2] + "/off.json", "w"))
for key in ("csv_monitor", "tensorboard"):
    config[key] = {"enabled": True, "output_path": sys.argv[2] + "/runs", "job_name": "mlp"}
json.dump(config, open(sys.argv[2] + "/on.json", "w"))
PY

run() {  # run <on|off>: prints "<mean ms/step> <wall seconds> <cpu seconds>"
  OPENBLAS_NUM_THREADS=1 /usr/bin/time -f "%e %U %S" -o "$work/$1.time" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    "$program" --config "$work/$1.json" --steps "$steps" --width "$width" --device cpu \
    > "$work/$1.out" 2> /dev/null
  read -r wall user system < "$work/$1.time"
  awk -v wall="$wall" -v cpu="$(echo "$user + $system" | bc)" '
    /^step .* ms\/step/ { n++; if (n > 5) { for (i = 1; i <= NF; i++) if ($i == "ms/step") { sum += $(i - 1); m++ } } }
    END { printf "%.4f %.3f %.3f\n", sum / m, wall, cpu }' "$work/$1.out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "round  off ms/step  on ms/step  off wall s  on wall s  off cpu s  on cpu s"
: > "$work/off.txt"; : > "$work/on.txt"
for ((r = 1; r <= rounds; r++)); do
  read -r off_ms off_wall off_cpu < <(run off)
  rm -rf "$work/runs"
  read -r on_ms on_wall on_cpu < <(run on)
  echo "$off_ms $off_wall $off_cpu" >> "$work/off.txt"
  echo "$on_ms $on_wall $on_cpu" >> "$work/on.txt"
  printf "%5d  %11s  %10s  %10s  %9s  %9s  %8s\n" "$r" "$off_ms" "$on_ms" "$off_wall" "$on_wall" \
    "$off_cpu" "$on_cpu"
done
for column in 1:ms/step 2:wall_s 3:cpu_s; do
  off=$(cut -d' ' -f"${column%%:*}" "$work/off.txt" | median)
  on=$(cut -d' ' -f"${column%%:*}" "$work/on.txt" | median)
  echo "median ${column#*:}: off $off, on $on, on/off $(echo "scale=4; $on / $off" | bc)"
done

#!/usr/bin/env bash
# Runs bench_nvme (the NVMe swapper) and fio --ioengine=io_uring --direct=1 on the same directory,
# size, block size and queue depth, alternating them for --rounds rounds (a shared machine's
# noise hits both alike), and prints each round and the medians with the swapper's share of fio.
# usage: benchmarks/run_bench_nvme.sh [--build DIR] [--path DIR] [--size 4G] [--block-size 1M]
#                                     [--queue-depth 8] [--rounds 3]
set -euo pipefail

build=build
path=.
size=4G
block_size=1M
queue_depth=8
rounds=3
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --block-size) block_size=$2; shift 2 ;;
    --queue-depth) queue_depth=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "run_bench_nvme.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "run_bench_nvme.sh: fio missing; run scripts/install_deps.sh" >&2; exit 1; }
bench="$build/benchmarks/bench_nvme"
[[ -x "$bench" ]] || { echo "run_bench_nvme.sh: $bench missing; build first" >&2; exit 1; }
mkdir -p "$path"

# fio: one job, one file, sequential, O_DIRECT through io_uring, the same depth and block size,
# and registered buffers and files where the swapper has them (fixedbufs, registerfiles; set from
# bench_nvme's first line); the write pass lays the file out, the read pass reads it back. fio
# reports bytes/s in bw_bytes.
fio_file="$path/zeroshard_fio_bench.dat"
fio_uring_options=()
fio_gbps() {
  fio --name=zeroshard --filename="$fio_file" --ioengine=io_uring --direct=1 --rw="$1" \
      --bs="$block_size" --iodepth="$queue_depth" --size="$size" --numjobs=1 \
      "${fio_uring_options[@]}" --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; \
print('%.3f' % (j['$1']['bw_bytes'] / 1e9))"
}
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

sw=(); sr=(); fw=(); fr=()
printf '%-6s %14s %14s %10s %10s\n' round "swapper write" "swapper read" "fio write" "fio read"
for ((round = 1; round <= rounds; ++round)); do
  out=$("$bench" --path "$path" --size "$size" --block-size "$block_size" --queue-depth "$queue_depth")
  if ((round == 1)); then
    echo "$out" | head -1
    fixedbufs=1 registerfiles=1
    grep -q 'buffers NOT registered' <<<"$out" && fixedbufs=0
    grep -q 'file NOT registered' <<<"$out" && registerfiles=0
    fio_uring_options=(--fixedbufs="$fixedbufs" --registerfiles="$registerfiles")
    echo "fio: --ioengine=io_uring --direct=1 ${fio_uring_options[*]}"
  fi
  sw+=("$(awk '/^swapper write GB\/s:/ {print $4}' <<<"$out")")
  sr+=("$(awk '/^swapper read GB\/s:/ {print $4}' <<<"$out")")
  fw+=("$(fio_gbps write)")
  fr+=("$(fio_gbps read)")
  rm -f "$fio_file"
  printf '%-6s %14s %14s %10s %10s\n' "$round" "${sw[-1]}" "${sr[-1]}" "${fw[-1]}" "${fr[-1]}"
done

echo "medians of $rounds rounds, GB/s (1e9 bytes/s), size $size, block $block_size, depth $queue_depth:"
printf '%-8s %14s %10s %8s\n' op "swapper GB/s" "fio GB/s" ratio
awk -v s="$(median "${sw[@]}")" -v f="$(median "${fw[@]}")" \
  'BEGIN { printf "%-8s %14.3f %10.3f %7.1f%%\n", "write", s, f, 100 * s / f }'
awk -v s="$(median "${sr[@]}")" -v f="$(median "${fr[@]}")" \
  'BEGIN { printf "%-8s %14.3f %10.3f %7.1f%%\n", "read", s, f, 100 * s / f }'

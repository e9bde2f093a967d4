#!/usr/bin/env bash
# Runs bench_nvme (the NVMe swapper) and fio --ioengine=io_uring --direct=1 on the same swap file,
# offsets, block size and queue depth, alternating them for --rounds rounds (a shared machine's
# noise hits both alike), and prints each round and the medians with the swapper's share of fio.
# usage: benchmarks/run_bench_nvme.sh [--build DIR] [--path DIR] [--size 4G] [--block-size 1M]
#                                     [--queue-depth 8] [--record-size 64M] [--buffers 2]
#                                     [--rounds 3] [--sqpoll]
# --buffers sets the swapper's requests in flight, each in a buffer of its own; the memory its I/O
# cycles through is buffers x record size, against fio's depth x block size.
set -euo pipefail

build=build
path=.
size=4G
block_size=1M
queue_depth=8
record_size=64M
buffers=2
rounds=3
sqpoll=()
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --block-size) block_size=$2; shift 2 ;;
    --queue-depth) queue_depth=$2; shift 2 ;;
    --record-size) record_size=$2; shift 2 ;;
    --buffers) buffers=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --sqpoll) sqpoll=(--sqpoll); shift ;;
    *) echo "run_bench_nvme.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "run_bench_nvme.sh: fio missing; run scripts/install_deps.sh" >&2; exit 1; }
bench="$build/benchmarks/bench_nvme"
[[ -x "$bench" ]] || { echo "run_bench_nvme.sh: $bench missing; build first" >&2; exit 1; }
mkdir -p "$path"

# Records of --record-size bytes (a 4 KiB header and the rest payload), so that every request of
# the swapper is a whole block and fio can make the same ones: slot s's copy A is the record at
# 2 * s * record, and a first write of every slot fills copies A only.
record=$(numfmt --from=iec "$record_size")
size_bytes=$(numfmt --from=iec "$size")
block_bytes=$(numfmt --from=iec "$block_size")
((record % block_bytes == 0 && record > 4096)) ||
  { echo "run_bench_nvme.sh: --block-size must divide --record-size" >&2; exit 2; }
records=$(((size_bytes + record - 1) / record))
slot_bytes=$((record - 4096))
swap_file="$path/zeroshard_rank0_bench.swp"
trap 'rm -f "$swap_file"' EXIT

# fio: one job on the swapper's file and offsets (zonemode=strided: each record, then skip the
# other copy), sequential, O_DIRECT through io_uring, the same depth and block size, and
# registered buffers and files and a submission-polling thread where the swapper has them
# (fixedbufs, registerfiles, sqthread_poll; set from bench_nvme's first line). The write pass
# writes every record, the read pass reads them back; fio reports bytes/s in bw_bytes.
fio_uring_options=()
# The swapper's buffers are transparent huge pages unless THP is "never"; fio gets huge pages only
# from the hugetlb pool (--iomem=mmaphuge), so it uses them where enough are free and says so
# where not (on 4 KiB pages a 1 MiB block is 256 segments, over virtio-blk's 254).
fio_mem=()
huge_kib=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
huge_needed=$(((queue_depth * block_bytes / 1024 + huge_kib - 1) / huge_kib + 1))
huge_free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
if grep -q '\[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
  echo "fio: transparent huge pages are off: both on 4 KiB pages"
elif ((huge_free >= huge_needed)); then
  fio_mem=(--iomem=mmaphuge)
else
  echo "fio: only $huge_free of the $huge_needed huge pages it needs are free, so fio runs on 4 KiB" \
    "pages and the swapper on huge pages; for a like-for-like run: sysctl vm.nr_hugepages=$huge_needed"
fi
fio_gbps() {
  fio --name=zeroshard --filename="$swap_file" --ioengine=io_uring --direct=1 --rw="$1" \
      --bs="$block_size" --iodepth="$queue_depth" --numjobs=1 --size=$((2 * records * record)) \
      --io_size=$((records * record)) --zonemode=strided --zonesize=$record \
      --zonerange=$((2 * record)) "${fio_uring_options[@]}" "${fio_mem[@]}" --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; \
print('%.3f' % (j['$1']['bw_bytes'] / 1e9))"
}
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ratio() { awk -v s="$1" -v f="$2" 'BEGIN { printf "%.2f", s / f }'; }

sw=(); sr=(); fw=(); fr=()
for ((round = 1; round <= rounds; ++round)); do
  # The swapper writes then reads every record and keeps the file; fio then writes and reads the
  # same records of it.
  out=$("$bench" --path "$path" --size $((records * slot_bytes)) --slot-bytes "$slot_bytes" \
          --block-size "$block_size" --queue-depth "$queue_depth" --buffers "$buffers" --keep \
          "${sqpoll[@]}")
  if ((round == 1)); then
    echo "$out" | head -1
    fixedbufs=1 registerfiles=1 sqthread_poll=0
    grep -q 'buffers NOT registered' <<<"$out" && fixedbufs=0
    grep -q 'file NOT registered' <<<"$out" && registerfiles=0
    grep -q 'sqpoll on' <<<"$out" && sqthread_poll=1
    fio_uring_options=(--fixedbufs="$fixedbufs" --registerfiles="$registerfiles"
                       --sqthread_poll="$sqthread_poll")
    echo "fio: --ioengine=io_uring --direct=1 ${fio_uring_options[*]} ${fio_mem[*]} --zonemode=strided, same file"
    printf '%-6s %14s %10s %6s %14s %10s %6s\n' round "swapper write" "fio write" ratio \
      "swapper read" "fio read" ratio
  fi
  sw+=("$(awk '/^swapper write GB\/s:/ {print $4}' <<<"$out")")
  sr+=("$(awk '/^swapper read GB\/s:/ {print $4}' <<<"$out")")
  fw+=("$(fio_gbps write)")
  fr+=("$(fio_gbps read)")
  printf '%-6s %14s %10s %6s %14s %10s %6s\n' "$round" "${sw[-1]}" "${fw[-1]}" \
    "$(ratio "${sw[-1]}" "${fw[-1]}")" "${sr[-1]}" "${fr[-1]}" "$(ratio "${sr[-1]}" "${fr[-1]}")"
done

echo "medians of $rounds rounds, GB/s (1e9 bytes/s), $records records of $record_size, block $block_size, depth $queue_depth, $buffers swapper buffers:"
printf '%-8s %14s %10s %8s\n' op "swapper GB/s" "fio GB/s" ratio
awk -v s="$(median "${sw[@]}")" -v f="$(median "${fw[@]}")" \
  'BEGIN { printf "%-8s %14.3f %10.3f %7.1f%%\n", "write", s, f, 100 * s / f }'
awk -v s="$(median "${sr[@]}")" -v f="$(median "${fr[@]}")" \
  'BEGIN { printf "%-8s %14.3f %10.3f %7.1f%%\n", "read", s, f, 100 * s / f }'

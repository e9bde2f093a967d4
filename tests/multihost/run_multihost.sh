#!/usr/bin/env bash
# Multi-host tests on one machine: the test hosts are network namespaces joined by veth pairs to
# bridges, and OpenMPI starts ranks in them over TCP through netns_agent.sh (plm rsh's agent).
#
# usage: run_multihost.sh equivalence HOSTS RANKS_PER_HOST
#          stages 0-3 of the example trainer on HOSTS hosts give the one-host run's losses and
#          parameter checksums bit for bit
#        run_multihost.sh link-down [HOSTS [CUT]]
#          HOSTS hosts (default 2), one rank each; the data link of host CUT (1..HOSTS, default
#          the last) is cut mid-run: the job must end, non-zero and with the collective timeout's
#          message, within 1.5 timeouts (plus slack) of the cut; from 3 hosts on, zeroshard-trace
#          must name that host's rank, and no other, from the flight recorders the ranks dumped
#        run_multihost.sh wire-bytes HOSTS
#          one rank per host; the bytes each host's data interface sends per reduce-scatter step,
#          for the ring and for MPI's own reduce-scatter, beside a ring's (N-1)/N * P * 4: the
#          ring must stay within kWireMaxRatio of it
#        run_multihost.sh trainer-bytes HOSTS
#          one rank per host; the bytes all hosts' data interfaces send per training step of
#          stages 0-3, with the ring reduce-scatter and with MPI's, then of stage 3 with qwZ
#          (a measurement, no check)
#        run_multihost.sh zeropp HOSTS RANKS_PER_HOST [LINKS [ROUNDS]]
#          stage 3 of the example trainer, plain, with each ZeRO++ mode (qwZ, hpZ, qgZ) and with
#          all three. First the bytes all hosts' data interfaces send per step in forward,
#          backward and step() (--wire-interface, gradients handed over at the end of backward so
#          that the phases part the gathers from the reduction), checked: qwZ's forward at most
#          kZeroppQwzMax x plain's, hpZ's backward (its gathers) at most kZeroppHpzMax x plain's,
#          qgZ's step() (the gradients) at most kZeroppQgzMax x plain's, all three at most
#          kZeroppSumMax x the sum of those parts. Then, for each link in LINKS (comma-separated, "unshaped" or a tbf rate
#          such as 1gbit; default unshaped), ROUNDS rounds (default 1) of every variant in an
#          order rotated each round: median step time and bytes per step, against plain stage 3
#          of the same round.
# Environment: ZEROSHARD_TRAINER (the zeroshard-train-mlp program; equivalence, link-down),
# ZEROSHARD_TRACE_TOOL (the zeroshard-trace program; link-down from 3 hosts on),
# ZEROSHARD_WIRE_BENCH (the zeroshard-reduce-scatter-wire program; wire-bytes),
# ZEROSHARD_SOURCE_DIR, ZEROSHARD_WORK_DIR (scratch; its path also names this run's namespaces),
# ZEROSHARD_LINK_RATE (a tbf rate, e.g. 1gbit: every host's data link is shaped to it, both ways,
# for the whole run; any mode), ZEROSHARD_ZEROPP_MODEL (the trainer's model flags in zeropp,
# default "--width 256 --layers 4"), ZEROSHARD_ZEROPP_BATCH (its micro-batch, default 4),
# ZEROSHARD_ZEROPP_STEPS (steps of each timed run, default 8).
# Exits 77, ctest's skip code here, with the reason where namespaces cannot be made.
set -euo pipefail

readonly kSkip=77
readonly kDataNet=10.213.0    # ranks' traffic (btl tcp); the link-down case cuts it
readonly kControlNet=10.213.1 # mpirun <-> daemons (oob tcp); mpirun sits at .254
readonly kLinkDownTimeout=6   # ZEROSHARD_COLLECTIVE_TIMEOUT_S of the link-down case
readonly kLinkDownCutAfter=3  # seconds of training before the cut
readonly kLinkDownSlack=3     # seconds for the abort to reach every rank and mpirun to exit
readonly kLinkDownGiveUp=60   # seconds after the cut before the case stops waiting
readonly kWireElements=4194304 # P, fp32 elements per reduce-scatter (16 MiB)
readonly kWireRepeats=4        # K, measured steps
readonly kWireMaxRatio=1.05    # TCP/IP headers and ACKs on top of the ring's payload
# A shaped link: a token bucket on each end of a host's data link. 256 KiB of burst and 10 ms of
# queue keep one TCP stream at 0.95 Gbit/s of payload under a 1 Gbit/s rate (measured here, see
# docs/zeropp.md); smaller bursts give the same, the kernel's timers being fine-grained.
readonly kShapeBurst=256kb
readonly kShapeLatency=10ms
readonly kZeroppModel="--width 256 --layers 4"
readonly kZeroppByteSteps=4   # steps of each byte run; the trainer leaves the first out
readonly kZeroppSkipSteps=2   # leading steps of a timed run left out of its median
readonly kZeroppQwzMax=0.27   # issue #29: qwZ's forward gather, x fp32's
readonly kZeroppHpzMax=0.01   # hpZ's backward gathers stay on the host; barriers' bytes remain
readonly kZeroppQgzMax=0.15   # qgZ's gradient bytes across hosts, x fp32's
readonly kZeroppSumMax=1.05   # all three together, x the sum of their parts

mode=${1:?usage: run_multihost.sh equivalence HOSTS RANKS_PER_HOST | link-down [HOSTS [CUT]] | wire-bytes HOSTS | trainer-bytes HOSTS | zeropp HOSTS RANKS_PER_HOST [LINKS [ROUNDS]]}
source_dir=${ZEROSHARD_SOURCE_DIR:?ZEROSHARD_SOURCE_DIR must name the source tree}
work_dir=${ZEROSHARD_WORK_DIR:?ZEROSHARD_WORK_DIR must name a scratch folder}
agent=$source_dir/tests/multihost/netns_agent.sh

case $mode in
  equivalence)
    hosts=${2:?HOSTS missing}
    ranks_per_host=${3:?RANKS_PER_HOST missing}
    tag=e${hosts}x${ranks_per_host}
    ;;
  link-down)
    hosts=${2:-2}
    cut_host=${3:-$hosts}
    ranks_per_host=1
    tag=ld${hosts}c$cut_host
    if ((cut_host < 1 || cut_host > hosts)); then
      echo "run_multihost.sh: link-down: got CUT $cut_host, expected a host 1..$hosts" >&2
      exit 2
    fi
    ;;
  wire-bytes | trainer-bytes)
    hosts=${2:?HOSTS missing}
    ranks_per_host=1
    tag=${mode:0:1}${hosts}
    ;;
  zeropp)
    hosts=${2:?HOSTS missing}
    ranks_per_host=${3:?RANKS_PER_HOST missing}
    links=${4:-unshaped}
    rounds=${5:-1}
    tag=zp${hosts}x${ranks_per_host}
    if ((ranks_per_host < 2)); then
      echo "run_multihost.sh: zeropp: got RANKS_PER_HOST $ranks_per_host, expected 2 or more" \
        "(hpZ partitions within a host)" >&2
      exit 2
    fi
    ;;
  *)
    echo "run_multihost.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
ranks=$((hosts * ranks_per_host))
work_dir=$work_dir/$tag
# One prefix per build folder and case: cases may run side by side, and a rerun finds what a
# killed earlier run of the same case left behind. Namespace names may be long; interface names
# (15 characters at most) are made inside the namespaces, where they need not be unique.
prefix=zsmh$(printf '%s' "$work_dir" | cksum | cut -d' ' -f1)-
switch=${prefix}sw # holds the bridges, and mpirun

skip() {
  echo "SKIPPED: $*"
  exit "$kSkip"
}
say() { echo "run_multihost.sh: $*"; }
now() { date +%s.%N; }
seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

our_namespaces() {
  ip netns list 2>/dev/null | awk -v p="$prefix" 'index($1, p) == 1 { print $1 }'
}

# Ends what still runs in our namespaces (only ever processes this case started there) and
# deletes them; their veth pairs and bridges go with them.
remove_namespaces() {
  local namespace pids
  for namespace in $(our_namespaces); do
    pids=$(ip netns pids "$namespace" 2>/dev/null || true)
    # shellcheck disable=SC2086 # one argument per process id
    if [[ -n $pids ]]; then kill -KILL $pids 2>/dev/null || true; fi
    ip netns delete "$namespace" 2>/dev/null || true
  done
}

[[ $EUID -eq 0 ]] || skip "network namespaces need root (running as uid $EUID)"
command -v ip >/dev/null || skip "no 'ip' command (iproute2) to make network namespaces"
if [[ -n ${ZEROSHARD_LINK_RATE:-} || ($mode == zeropp && $links != unshaped) ]]; then
  command -v tc >/dev/null || skip "no 'tc' command (iproute2) to shape the links"
fi
if [[ $mode == wire-bytes ]]; then
  wire_bench=${ZEROSHARD_WIRE_BENCH:?ZEROSHARD_WIRE_BENCH must name zeroshard-reduce-scatter-wire}
  [[ -x $wire_bench ]] || { say "no zeroshard-reduce-scatter-wire at $wire_bench"; exit 1; }
else
  trainer=${ZEROSHARD_TRAINER:?ZEROSHARD_TRAINER must name zeroshard-train-mlp}
  [[ -x $trainer ]] || { say "no trainer at $trainer"; exit 1; }
fi
if [[ $mode == link-down && $hosts -ge 3 ]]; then
  trace_tool=${ZEROSHARD_TRACE_TOOL:?ZEROSHARD_TRACE_TOOL must name zeroshard-trace}
  [[ -x $trace_tool ]] || { say "no zeroshard-trace at $trace_tool"; exit 1; }
fi

remove_namespaces # leftovers of a killed earlier run
trap remove_namespaces EXIT
trap 'exit 130' INT TERM
rm -rf "$work_dir"
mkdir -p "$work_dir"

# The switch namespace: a data bridge and a control bridge, mpirun's control address on the
# latter. Host K gets veth d0 = $kDataNet.K and c0 = $kControlNet.K, whose peers dK and cK sit on
# the bridges. Nothing is added to the machine's own namespace.
make_network() {
  local error k host
  error=$(ip netns add "$switch" 2>&1) || skip "ip netns add failed: $error"
  ip -n "$switch" link set lo up
  error=$(ip -n "$switch" link add br-data type bridge 2>&1) || skip "cannot make a bridge: $error"
  ip -n "$switch" link add br-ctl type bridge
  ip -n "$switch" addr add "$kControlNet.254/24" dev br-ctl
  ip -n "$switch" link set br-data up
  ip -n "$switch" link set br-ctl up
  hosts_map=
  hostfile=$work_dir/hostfile
  : >"$hostfile"
  for ((k = 1; k <= hosts; ++k)); do
    host=${prefix}h$k
    ip netns add "$host"
    ip -n "$host" link set lo up
    error=$(ip -n "$host" link add d0 type veth peer name "d$k" netns "$switch" 2>&1) ||
      skip "cannot make a veth pair: $error"
    ip -n "$host" link add c0 type veth peer name "c$k" netns "$switch"
    ip -n "$host" addr add "$kDataNet.$k/24" dev d0
    ip -n "$host" addr add "$kControlNet.$k/24" dev c0
    ip -n "$host" link set d0 up
    ip -n "$host" link set c0 up
    ip -n "$switch" link set "d$k" master br-data up
    ip -n "$switch" link set "c$k" master br-ctl up
    hosts_map+="$kControlNet.$k=$host "
    echo "$kControlNet.$k slots=$ranks_per_host" >>"$hostfile"
  done
  # Bridge ports forward at once without STP; wait in case a kernel makes them learn first.
  local tries
  for ((tries = 0; tries < 50; ++tries)); do
    [[ $(bridge -n "$switch" link show | grep -c 'state forwarding') -eq $((2 * hosts)) ]] &&
      return 0
    sleep 0.1
  done
  bridge -n "$switch" link show
  say "the bridge ports do not forward"
  exit 1
}

# Shapes every host's data link to $1 (a tbf rate) both ways: d0's egress in the host, and its
# peer's egress on the bridge, i.e. what the host receives. Bytes are counted after the queue.
shape_links() {
  local k error
  for ((k = 1; k <= hosts; ++k)); do
    error=$(tc -n "${prefix}h$k" qdisc replace dev d0 root tbf rate "$1" burst "$kShapeBurst" \
      latency "$kShapeLatency" 2>&1) || skip "cannot shape a link with tbf: $error"
    tc -n "$switch" qdisc replace dev "d$k" root tbf rate "$1" burst "$kShapeBurst" \
      latency "$kShapeLatency"
  done
}

unshape_links() {
  local k
  for ((k = 1; k <= hosts; ++k)); do
    tc -n "${prefix}h$k" qdisc del dev d0 root 2>/dev/null || true
    tc -n "$switch" qdisc del dev "d$k" root 2>/dev/null || true
  done
}

# mpirun in the switch namespace, starting $ranks ranks on the hosts over TCP only.
mpirun_on_hosts() {
  local forward=(-x OPENBLAS_NUM_THREADS=1)
  if [[ -n ${ZEROSHARD_COLLECTIVE_TIMEOUT_S:-} ]]; then
    forward+=(-x ZEROSHARD_COLLECTIVE_TIMEOUT_S)
  fi
  local name
  for name in ZEROSHARD_REDUCE_SCATTER ZEROSHARD_TRACE_DIR ZEROSHARD_FLIGHT_RECORDER_SIZE; do
    if [[ -n ${!name:-} ]]; then forward+=(-x "$name"); fi
  done
  ip netns exec "$switch" env \
    ZEROSHARD_NETNS_HOSTS="$hosts_map" ZEROSHARD_NETNS_TMPDIR="$work_dir/tmp" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --hostfile "$hostfile" -np "$ranks" \
    --mca plm rsh --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$kControlNet.0/24" \
    --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$kDataNet.0/24" \
    "${forward[@]}" "$@"
}

# The same program on this machine alone, as the example's own tests run it.
mpirun_on_one_host() {
  OPENBLAS_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np "$ranks" "$@"
}

# The report without its memory section: stage, world size, every step's loss and the parameter
# checksums. nlohmann::json writes doubles so that they read back exactly, so equal text here is
# equal bits.
results_of() {
  awk '/^  "memory": \[/ { skip = 1; next } skip && /^  \],?$/ { skip = 0; next } !skip' "$1"
}

failures=0
check() {
  if "${@:2}"; then
    echo "[ ok ] $1"
  else
    echo "[FAIL] $1"
    failures=$((failures + 1))
  fi
}

# Each rank must run on its own host: ranks 0..R-1 on host 1, R..2R-1 on host 2, and so on, each
# host with its own host name (hpZ and qgZ group ranks by it).
check_placement() {
  local expected='' r host
  for ((r = 0; r < ranks; ++r)); do
    host=$((r / ranks_per_host + 1))
    expected+="$r $kDataNet.$host/24 ${prefix}h$host"$'\n'
  done
  local seen
  # shellcheck disable=SC2016 # expanded by each rank's shell
  seen=$(mpirun_on_hosts /bin/sh -c \
    'echo "$OMPI_COMM_WORLD_RANK $(ip -o -4 addr show dev d0 | awk "{ print \$4 }") $(hostname)"' |
    sort -n)
  check "ranks run on their hosts: ${seen//$'\n'/, }" test "$seen"$'\n' = "$expected"
}

run_equivalence() {
  check_placement
  local stage args one_host on_hosts start what
  for stage in 0 1 2 3; do
    one_host=$work_dir/zero${stage}_one_host.json
    on_hosts=$work_dir/zero${stage}_${hosts}_hosts.json
    args=(--config "$source_dir/examples/configs/zero$stage.json" --steps 20 --width 128
      --device cpu)
    start=$(now)
    mpirun_on_one_host "$trainer" "${args[@]}" --report-json "$one_host" >"$one_host.log" 2>&1 ||
      { cat "$one_host.log"; say "stage $stage: the one-host run failed"; exit 1; }
    say "stage $stage: $ranks ranks on one host took $(seconds_between "$start" "$(now)") s"
    start=$(now)
    mpirun_on_hosts "$trainer" "${args[@]}" --report-json "$on_hosts" >"$on_hosts.log" 2>&1 ||
      { cat "$on_hosts.log"; say "stage $stage: the $hosts-host run failed"; exit 1; }
    say "stage $stage: $ranks ranks on $hosts hosts took $(seconds_between "$start" "$(now)") s"
    what="stage $stage: $ranks ranks on $hosts hosts give the one-host losses and parameter"
    check "$what checksums bit for bit" diff <(results_of "$one_host") <(results_of "$on_hosts")
  done
}

run_link_down() {
  local log=$work_dir/link_down.log pid start started cut end elapsed bound waited rc left
  export ZEROSHARD_COLLECTIVE_TIMEOUT_S=$kLinkDownTimeout
  # Every namespace sees the same file system, as ranks on a shared one would.
  export ZEROSHARD_TRACE_DIR=$work_dir/trace
  start=$(now)
  : >"$log"
  # Stage 2, 100-element all-gather chunks, one sample per rank: most of a step is the parameter
  # all-gather, which keeps three requests in flight, so the cut almost always strands several.
  mpirun_on_hosts "$trainer" --config "$source_dir/tests/multihost/link_down_zero2.json" \
    --steps 1000000 --width 256 --device cpu >"$log" 2>&1 &
  pid=$!
  # Cut once training runs, so that start-up time does not count.
  for ((waited = 0; waited < 600; ++waited)); do
    grep -q '^step ' "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^step ' "$log"; then
    kill -KILL "$pid" 2>/dev/null || true
    cat "$log"
    say "the run did not start training"
    exit 1
  fi
  started=$(now)
  sleep "$kLinkDownCutAfter"
  ip -n "$switch" link set "d$cut_host" down
  cut=$(now)
  say "training from $(seconds_between "$start" "$started") s; data link of host $cut_host cut at" \
    "$(seconds_between "$start" "$cut") s"
  while kill -0 "$pid" 2>/dev/null; do
    if awk -v e="$(seconds_between "$cut" "$(now)")" -v g="$kLinkDownGiveUp" \
      'BEGIN { exit !(e > g) }'; then
      say "still running $kLinkDownGiveUp s after the cut; ending it"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  rc=0
  wait "$pid" || rc=$?
  end=$(now)
  elapsed=$(seconds_between "$cut" "$end")
  bound=$(awk -v t="$kLinkDownTimeout" -v s="$kLinkDownSlack" 'BEGIN { print 1.5 * t + s }')
  sed 's/^/  | /' "$log" | grep -v '^  | step ' | tail -n 40
  say "the job ended $elapsed s after the cut ($(seconds_between "$start" "$end") s after mpirun" \
    "started); ZEROSHARD_COLLECTIVE_TIMEOUT_S=$kLinkDownTimeout, limit $bound s"
  left=
  for ((k = 1; k <= hosts; ++k)); do left+=$(ip netns pids "${prefix}h$k"); done
  check "the job exits non-zero (mpirun status $rc)" test "$rc" -ne 0
  # The trainer prints the exception that ended it (TimeoutError's message), not only a log line.
  check "a rank ends with the collective timeout's error" \
    grep -q '^zeroshard-train-mlp: .*did not complete within' "$log"
  check "no rank or daemon is left on any host" test -z "$left"
  check "the job ends within 1.5 timeouts + $kLinkDownSlack s of the cut ($elapsed s <= $bound s)" \
    awk -v e="$elapsed" -v b="$bound" 'BEGIN { exit !(e <= b) }'
  # Two hosts that cannot hear each other are symmetric: no record can tell whose link was cut.
  if [[ $hosts -ge 3 ]]; then check_trace_names "$((cut_host - 1))"; fi
}

# zeroshard-trace on the dumps must name rank $1, and no other rank, in every communicator that
# names one.
check_trace_names() {
  local report=$work_dir/trace_report.txt status=0 named
  "$trace_tool" "$ZEROSHARD_TRACE_DIR" >"$report" 2>&1 || status=$?
  sed 's/^/  | /' "$report"
  named=$(sed -n 's/^named: //p' "$report" | sort -u | tr '\n' ' ')
  check "zeroshard-trace names a rank (exit $status)" test "$status" -eq 0
  check "zeroshard-trace names rank $1, whose link was cut, and no other (named: $named)" \
    test "$named" = "rank $1 "
}

run_wire_bytes() {
  check_placement
  local algorithm log
  for algorithm in ring mpi; do
    log=$work_dir/wire_$algorithm.log
    ZEROSHARD_REDUCE_SCATTER=$algorithm mpirun_on_hosts "$wire_bench" --interface d0 \
      --elements "$kWireElements" --repeats "$kWireRepeats" >"$log" 2>&1 ||
      { cat "$log"; say "the $algorithm run failed"; exit 1; }
    cat "$log"
  done
  # Every rank of the ring within the bound; MPI's own is reported, not held to it.
  # shellcheck disable=SC2016 # awk's own fields
  check "the ring sends at most $kWireMaxRatio x a ring's bytes per step on every host" \
    awk -v m="$kWireMaxRatio" '/ratio/ { if ($NF + 0 > m + 0) bad = 1; seen = 1 }
      END { exit !(seen && !bad) }' "$work_dir/wire_ring.log"
}

# Bytes sent so far by every host's data interface together.
data_bytes_sent() {
  local total=0 k sent
  for ((k = 1; k <= hosts; ++k)); do
    # shellcheck disable=SC2016 # awk's own fields
    sent=$(ip netns exec "${prefix}h$k" awk '$1 == "d0:" { print $10 }' /proc/net/dev)
    total=$((total + sent))
  done
  echo "$total"
}

# Whole runs are counted, start-up included, and divided by the steps: an upper bound per step.
run_trainer_bytes() {
  check_placement
  # Stage 0 (a reduce-scatter and an all-gather of the gradients, a ring all-reduce's bytes) is
  # the reference.
  local stage algorithm before log per_step stage0='' stage3='' steps=20
  for stage in 0 1 2 3; do
    for algorithm in ring mpi; do
      log=$work_dir/zero${stage}_$algorithm.log
      before=$(data_bytes_sent)
      ZEROSHARD_REDUCE_SCATTER=$algorithm mpirun_on_hosts "$trainer" \
        --config "$source_dir/examples/configs/zero$stage.json" --steps "$steps" --width 256 \
        --device cpu >"$log" 2>&1 || { cat "$log"; say "stage $stage, $algorithm: failed"; exit 1; }
      per_step=$((($(data_bytes_sent) - before) / steps))
      stage0=${stage0:-$per_step}
      [[ $stage == 3 && $algorithm == ring ]] && stage3=$per_step
      say "stage $stage, reduce-scatter $algorithm: $per_step bytes per step from all $hosts" \
        "hosts, $(awk -v a="$per_step" -v b="$stage0" 'BEGIN { printf "%.3f", a / b }') x stage 0"
    done
  done
  # Stage 3 with qwZ: every gather sends int8 blocks (zero_quantized_weights), the reduce-scatter
  # of the gradients stays fp32.
  local qwz_config=$work_dir/zero3_qwz.json
  python3 - "$source_dir/examples/configs/zero3.json" "$qwz_config" <<'EOF_PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["zero_optimization"]["zero_quantized_weights"] = True
json.dump(config, open(sys.argv[2], "w"))
EOF_PY
  log=$work_dir/zero3_qwz.log
  before=$(data_bytes_sent)
  mpirun_on_hosts "$trainer" --config "$qwz_config" --steps "$steps" --width 256 --device cpu \
    >"$log" 2>&1 || { cat "$log"; say "stage 3 with qwZ: failed"; exit 1; }
  per_step=$((($(data_bytes_sent) - before) / steps))
  say "stage 3 with qwZ, reduce-scatter ring: $per_step bytes per step from all $hosts hosts," \
    "$(awk -v a="$per_step" -v b="$stage0" 'BEGIN { printf "%.3f", a / b }') x stage 0," \
    "$(awk -v a="$per_step" -v b="$stage3" 'BEGIN { printf "%.3f", a / b }') x stage 3"
  say "$(grep -o -m 1 'with [0-9]* parameters' "$log") of fp32"
}

# The zeropp variants, each examples/configs/zero3.json with keys added (make_zeropp_configs).
readonly zeropp_variants=(plain qwz hpz qgz all)
declare -A zeropp_forward=() zeropp_backward=() zeropp_step=()

# $work_dir/zeropp_VARIANT.json: the micro-batch set, the engine's own progress lines off.
make_zeropp_configs() {
  python3 - "$source_dir/examples/configs/zero3.json" "$work_dir" "$ranks_per_host" \
    "${ZEROSHARD_ZEROPP_BATCH:-4}" <<'EOF_PY'
import json, sys
base, out, ranks_per_host, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
modes = {
    "plain": {},
    "qwz": {"zero_quantized_weights": True},
    "hpz": {"zero_hpz_partition_size": ranks_per_host},
    "qgz": {"zero_quantized_gradients": True},
}
modes["all"] = {k: v for m in ("qwz", "hpz", "qgz") for k, v in modes[m].items()}
for name, keys in modes.items():
    config = json.load(open(base))
    config["train_micro_batch_size_per_gpu"] = batch
    config["steps_per_print"] = 0
    config["zero_optimization"].update(keys)
    json.dump(config, open(f"{out}/zeropp_{name}.json", "w"), indent=2)
EOF_PY
}

# The trainer on variant $1's config, logging to $2 and reporting to $3, the rest added to its
# flags; a failure ends the case.
run_zeropp_variant() {
  local variant=$1 log=$2 report=$3
  shift 3
  # shellcheck disable=SC2086 # the model's flags, one word each
  mpirun_on_hosts "$trainer" --config "$work_dir/zeropp_$variant.json" --device cpu \
    ${ZEROSHARD_ZEROPP_MODEL:-$kZeroppModel} --wire-interface d0 --report-json "$report" "$@" \
    >"$log" 2>&1 && return 0
  cat "$log"
  say "zeropp, $variant: failed"
  exit 1
}

ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", (b > 0 ? a / b : 0) }'; }
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# Bytes per phase: gradients handed over at the end of backward, so that backward holds the
# gathers alone and step() the whole reduction.
run_zeropp_bytes() {
  local variant report phases
  for variant in "${zeropp_variants[@]}"; do
    report=$work_dir/bytes_$variant.json
    run_zeropp_variant "$variant" "${report%.json}.log" "$report" --steps "$kZeroppByteSteps" \
      --grad-handover end
    phases=$(python3 -c 'import json, sys; w = json.load(open(sys.argv[1]))["wire"]
print(round(w["forward"]), round(w["backward"]), round(w["step"]))' "$report")
    read -r "zeropp_forward[$variant]" "zeropp_backward[$variant]" "zeropp_step[$variant]" \
      <<<"$phases"
    say "bytes per step from all $hosts hosts, $variant: forward ${zeropp_forward[$variant]}," \
      "backward ${zeropp_backward[$variant]}, step() ${zeropp_step[$variant]}"
  done
  local qwz hpz qgz sum all
  qwz=$(ratio_of "${zeropp_forward[qwz]}" "${zeropp_forward[plain]}")
  check "qwZ's forward gathers across hosts: ${qwz}x plain's (at most $kZeroppQwzMax)" \
    at_most "$qwz" "$kZeroppQwzMax"
  hpz=$(ratio_of "${zeropp_backward[hpz]}" "${zeropp_backward[plain]}")
  check "hpZ's backward gathers across hosts: ${zeropp_backward[hpz]} bytes, ${hpz}x plain's \
(at most $kZeroppHpzMax)" at_most "$hpz" "$kZeroppHpzMax"
  qgz=$(ratio_of "${zeropp_step[qgz]}" "${zeropp_step[plain]}")
  check "qgZ's gradient reduction across hosts: ${qgz}x plain's (at most $kZeroppQgzMax)" \
    at_most "$qgz" "$kZeroppQgzMax"
  sum=$((zeropp_forward[qwz] + zeropp_backward[hpz] + zeropp_step[qgz]))
  all=$((zeropp_forward[all] + zeropp_backward[all] + zeropp_step[all]))
  check "all three together across hosts: $(ratio_of "$all" "$sum")x the sum of their parts, \
qwZ's forward + hpZ's backward + qgZ's step() (at most $kZeroppSumMax)" \
    at_most "$(ratio_of "$all" "$sum")" "$kZeroppSumMax"
}

# Step time and bytes per step on each link, every variant once per round, the order rotated.
run_zeropp_timing() {
  local link round i variant log count=${#zeropp_variants[@]} runs=$work_dir/timing.tsv
  : >"$runs"
  for link in ${links//,/ }; do
    if [[ $link == unshaped ]]; then unshape_links; else shape_links "$link"; fi
    for ((round = 1; round <= rounds; ++round)); do
      for ((i = 0; i < count; ++i)); do
        variant=${zeropp_variants[$(((i + round - 1) % count))]}
        log=$work_dir/time_${link}_${variant}_$round.log
        run_zeropp_variant "$variant" "$log" "${log%.log}.json" \
          --steps "${ZEROSHARD_ZEROPP_STEPS:-8}"
        printf '%s\t%s\t%s\t%s\n' "$link" "$variant" "$round" "$log" >>"$runs"
      done
    done
  done
  unshape_links
  python3 - "$runs" "$kZeroppSkipSteps" "$hosts" <<'EOF_PY'
import json, re, statistics, sys
runs, skip, hosts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [line.rstrip("\n").split("\t") for line in open(runs)]
ms, wire = {}, {}
for link, variant, rnd, log in rows:
    steps = [float(m.group(1)) for m in re.finditer(r"\|\s+([0-9.]+) ms/step", open(log).read())]
    ms[link, variant, rnd] = statistics.median(steps[skip:] or steps)
    w = json.load(open(log[:-4] + ".json"))["wire"]
    wire[link, variant, rnd] = w["forward"] + w["backward"] + w["step"]
def spread(values):
    return f"{statistics.median(values):.3f}" + (
        f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else "")
print("| link | variant | ms/step | x plain | bytes/step, all hosts | x plain | Gbit/s per host |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for link in dict.fromkeys(r[0] for r in rows):
    for variant in dict.fromkeys(r[1] for r in rows if r[0] == link):
        rounds = [r[2] for r in rows if r[0] == link and r[1] == variant]
        t = [ms[link, variant, r] for r in rounds]
        b = [wire[link, variant, r] for r in rounds]
        t_ratio = [ms[link, variant, r] / ms[link, "plain", r] for r in rounds]
        b_ratio = [wire[link, variant, r] / wire[link, "plain", r] for r in rounds]
        rate = statistics.median(b) / hosts * 8 / (statistics.median(t) / 1000) / 1e9
        print(f"| {link} | {variant} | {statistics.median(t):.1f} | {spread(t_ratio)} | "
              f"{statistics.median(b):,.0f} | {spread(b_ratio)} | {rate:.2f} |")
EOF_PY
}

run_zeropp() {
  check_placement
  make_zeropp_configs
  say "model: ${ZEROSHARD_ZEROPP_MODEL:-$kZeroppModel}, micro-batch ${ZEROSHARD_ZEROPP_BATCH:-4}"
  run_zeropp_bytes
  grep -o -m 1 'with [0-9]* parameters' "$work_dir/bytes_plain.log" | sed 's/^/  | /'
  run_zeropp_timing
}

make_network
if [[ -n ${ZEROSHARD_LINK_RATE:-} ]]; then shape_links "$ZEROSHARD_LINK_RATE"; fi
say "$hosts hosts ($(our_namespaces | tr '\n' ' ')), $ranks ranks"
case $mode in
  equivalence) run_equivalence ;;
  link-down) run_link_down ;;
  wire-bytes) run_wire_bytes ;;
  trainer-bytes) run_trainer_bytes ;;
  zeropp) run_zeropp ;;
esac
[[ $failures -eq 0 ]] || { say "$failures check(s) failed"; exit 1; }

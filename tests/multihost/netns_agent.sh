#!/usr/bin/env bash
# OpenMPI launcher agent (--mca plm_rsh_agent) for test hosts that are network namespaces: where
# ssh would log in to HOST and hand the command to a shell there, this runs it in HOST's namespace.
#
# OpenMPI calls it as `netns_agent.sh HOST WORD...`, HOST as the hostfile names it (an address) and
# the words a shell line ("PATH=...; export PATH; ... orted -mca ..."). ZEROSHARD_NETNS_HOSTS maps
# each address to its namespace, "ADDR=NAMESPACE ADDR=NAMESPACE ...".
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "netns_agent.sh: usage: netns_agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
namespace=
for entry in ${ZEROSHARD_NETNS_HOSTS:-}; do
  if [[ ${entry%%=*} == "$host" ]]; then namespace=${entry#*=}; fi
done
if [[ -z $namespace ]]; then
  echo "netns_agent.sh: no namespace for host '$host' in ZEROSHARD_NETNS_HOSTS" >&2
  exit 255
fi
# Every namespace sees the same file system, so each host gets its own TMPDIR: the daemons'
# session directories would otherwise be shared (they were also named after one shared hostname,
# before each host got its own below).
if [[ -n ${ZEROSHARD_NETNS_TMPDIR:-} ]]; then
  export TMPDIR=$ZEROSHARD_NETNS_TMPDIR/$namespace
  mkdir -p "$TMPDIR"
fi
# Each host has its own host name, the namespace's, in a UTS namespace of its own: hpZ and qgZ
# group ranks into nodes by gethostname(), and OpenMPI's shared-memory placement reads it too.
# As ssh does, join the words into one line for a shell; the environment passes through as is.
# shellcheck disable=SC2016 # expanded by the inner shell
exec ip netns exec "$namespace" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' \
  "$namespace" "$*"

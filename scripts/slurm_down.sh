#!/usr/bin/env bash
# Stop the daemons scripts/slurm_up.sh started, by the pid files it wrote (never by name), and remove what
# its NODES>=2 mode made: the namespaced nodes hlnode<i> (network namespace, veth hlv<i>, /etc/netns/hlnode<i>)
# and the bridge hlbr0.
#
#   slurm_down.sh --nodes-above K   only the namespaced nodes numbered above K (K=0: all, and the bridge);
#                                   the rest of the cluster stays (slurm_up.sh runs this when NODES shrinks)
set -uo pipefail
RUN=${SLURM_RUN:-/run/hydralight-slurm}
BRIDGE=hlbr0
has_link() { command -v ip >/dev/null && ip link show "$1" >/dev/null 2>&1; }

stop() {  # stop NAME: the process whose pid is in $RUN/NAME.pid
  local pidfile="$RUN/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "stopped $1 ($pid)"
  fi
  rm -f "$pidfile"
}

remove_node() {  # remove_node hlnode<i>
  local node=$1 pids
  stop "slurmd-$node"
  if [ -e "/run/netns/$node" ]; then
    # Job steps still running there would keep the namespace and its link alive: they end too, by pid.
    pids=$(ip netns pids "$node" 2>/dev/null | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
      kill -TERM $pids 2>/dev/null
      for _ in $(seq 50); do [ -z "$(ip netns pids "$node" 2>/dev/null)" ] && break; sleep 0.2; done
      pids=$(ip netns pids "$node" 2>/dev/null | tr '\n' ' ')
      [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null
      echo "ended the processes left in $node"
    fi
  fi
  # The pair's end on the bridge first (that deletes both ends now, not once the namespace is freed).
  ! has_link "hlv${node#hlnode}" || ip link del "hlv${node#hlnode}"
  [ ! -e "/run/netns/$node" ] || ip netns del "$node"
  rm -rf "/etc/netns/$node"
  [ ! -f "$RUN/netns.made" ] || sed -i "/^$node\$/d" "$RUN/netns.made"
  echo "removed node $node"
}

above=0
if [ "${1:-}" = --nodes-above ]; then
  above=${2:?--nodes-above needs a number}
else
  stop slurmd  # this machine's node first, as before; with NODES>=2 its pid file is slurmd-<host>.pid
  for pidfile in "$RUN"/slurmd-*.pid; do
    name=$(basename "$pidfile" .pid)
    [ -f "$pidfile" ] && [[ ! "$name" =~ ^slurmd-hlnode[0-9]+$ ]] && stop "$name"
  done
fi

# The namespaced nodes: those recorded as made, and any whose slurmd still has a pid file.
nodes=$( (cat "$RUN/netns.made" 2>/dev/null; cd "$RUN" 2>/dev/null && ls slurmd-hlnode*.pid 2>/dev/null |
          sed 's/^slurmd-//; s/\.pid$//') | sort -u)
for node in $nodes; do
  [[ "$node" =~ ^hlnode([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -gt "$above" ] && remove_node "$node"
done
if [ "$above" = 0 ]; then
  if has_link "$BRIDGE"; then ip link del "$BRIDGE" && echo "removed bridge $BRIDGE"; fi
  # /etc/netns itself only if slurm_up.sh made it and nothing else is in it.
  if [ -f "$RUN/etc-netns.made" ]; then rmdir /etc/netns 2>/dev/null; rm -f "$RUN/etc-netns.made"; fi
  rm -f "$RUN/netns.made"
fi
[ "${1:-}" = --nodes-above ] && exit 0

for daemon in slurmctld slurmdbd mariadbd munged; do
  stop "$daemon"
done

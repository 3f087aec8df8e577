#!/usr/bin/env bash
# Stop the daemons scripts/slurm_up.sh started, by the pid files it wrote (never by name), and remove what
# its NODES>=2 mode made: the namespaced nodes hlnode<i> (network namespace, veth hlv<i>, /etc/netns/hlnode<i>)
# and the bridge hlbr0. Only what slurm_up.sh recorded making ($RUN/*.made): a namesake it did not make stays.
#
#   slurm_down.sh --nodes-above K   only the namespaced nodes numbered above K (K=0: all, and the bridge);
#                                   the rest of the cluster stays (slurm_up.sh runs this when NODES shrinks)
set -uo pipefail
RUN=${SLURM_RUN:-/run/hydralight-slurm}
BRIDGE=hlbr0
has_link() { command -v ip >/dev/null && ip link show "$1" >/dev/null 2>&1; }
# As in slurm_up.sh: $RUN/KIND.made holds a line "NAME ID" per object it made (KIND bridge, veth, netns,
# etc-netns-node); ID tells that object from a namesake made since by someone else.
obj_id() {  # obj_id KIND NAME: the ID of what has that name now; nothing if there is none
  case $1 in
    bridge|veth) if command -v ip >/dev/null; then ip -o link show dev "$2" 2>/dev/null | cut -d: -f1; fi ;;
    netns) if [ -e "/run/netns/$2" ]; then stat -L -c %i "/run/netns/$2" 2>/dev/null; fi ;;
    etc-netns-node) if [ -e "/etc/netns/$2" ]; then stat -c %i "/etc/netns/$2" 2>/dev/null; fi ;;
  esac
  return 0
}
made() {  # made KIND NAME: NAME is there and is what slurm_up.sh recorded making
  local id; id=$(obj_id "$1" "$2")
  [ -n "$id" ] && grep -qxF "$2 $id" "$RUN/$1.made" 2>/dev/null
}
forget() { [ ! -f "$RUN/$1.made" ] || sed -i "/^$2\( \|\$\)/d" "$RUN/$1.made"; }  # forget KIND NAME
prune() {  # prune KIND: keep the records of what is still there as recorded; none left, no file
  local file=$RUN/$1.made name id kept=""
  [ -f "$file" ] || return 0
  while read -r name id; do
    if [ -n "$id" ] && [ "$(obj_id "$1" "$name")" = "$id" ]; then kept+="$name $id"$'\n'; fi
  done < "$file"
  if [ -n "$kept" ]; then printf %s "$kept" > "$file"; else rm -f "$file"; fi
}

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

remove_node() {  # remove_node <i>: node hlnode<i>'s slurmd, and what slurm_up.sh made for it
  local node=hlnode$1 link=hlv$1 pids removed=() kind
  stop "slurmd-$node"
  if made netns "$node"; then
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
  if made veth "$link"; then ip link del "$link" && forget veth "$link" && removed+=("link $link"); fi
  if made netns "$node"; then ip netns del "$node" && forget netns "$node" && removed+=("namespace $node"); fi
  if made etc-netns-node "$node"; then
    rm -rf "/etc/netns/$node" && forget etc-netns-node "$node" && removed+=("/etc/netns/$node")
  fi
  [ "${#removed[@]}" = 0 ] || echo "removed node $node: $(printf '%s, ' "${removed[@]}" | sed 's/, $//')"
  for kind in "netns $node" "veth $link" "etc-netns-node $node"; do  # namesakes it did not make stay
    set -- $kind
    if [ -n "$(obj_id "$1" "$2")" ] && ! made "$1" "$2"; then echo "left $1 $2 alone: slurm_up.sh did not make it"; fi
  done
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

# The namespaced nodes: those with something recorded as made, and any whose slurmd still has a pid file.
nodes=$({ cat "$RUN/netns.made" "$RUN/veth.made" "$RUN/etc-netns-node.made" 2>/dev/null
          (cd "$RUN" 2>/dev/null && ls slurmd-hlnode*.pid 2>/dev/null); } |
        sed -nE 's/^(slurmd-)?(hlnode|hlv)([0-9]+)([ .].*)?$/\3/p' | sort -nu)
for i in $nodes; do
  [ "$i" -le "$above" ] || remove_node "$i"
done
if [ "$above" = 0 ]; then
  if made bridge "$BRIDGE"; then ip link del "$BRIDGE" && forget bridge "$BRIDGE" && echo "removed bridge $BRIDGE"
  elif has_link "$BRIDGE"; then echo "left bridge $BRIDGE alone: slurm_up.sh did not make it"; fi
  # /etc/netns itself only if slurm_up.sh made it and nothing else is in it.
  if [ -f "$RUN/etc-netns.made" ]; then rmdir /etc/netns 2>/dev/null; rm -f "$RUN/etc-netns.made"; fi
fi
for kind in bridge netns veth etc-netns-node; do prune "$kind"; done  # records of what is gone (or never was)
[ "${1:-}" = --nodes-above ] && exit 0

for daemon in slurmctld slurmdbd mariadbd munged; do
  stop "$daemon"
done

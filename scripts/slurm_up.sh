#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster (controller, node daemon, accounting) on this Debian/Ubuntu
# machine, as root, without systemd. Idempotent: what already runs is left alone. Try sweeps here
# before sending them to a real cluster; the test suite uses it too. Stop it with scripts/slurm_down.sh.
#
#   NUM_FAKE_GPUS=8   GPUs declared as gres (fake devices) so GPU requests can be submitted and checked
#   SLURM_RUN=/run/hydralight-slurm   where pid files live (slurm_down.sh reads them)
#   NODES=1           NODES=N>=2 adds N compute nodes hlnode1..hlnodeN, partition `multi`, each a separate
#                     network host: its slurmd runs in its own network and UTS namespace (own hostname, own
#                     address SLURM_SUBNET.(10+i) on the bridge hlbr0), so multi-node jobs (DDP across hosts,
#                     signals, requeue) run for real. This machine's node and partition debug (the default)
#                     stay as with NODES=1; running with a smaller NODES removes the nodes above it.
#                     What it makes of the network is recorded in $RUN (see made() below), and only that is
#                     ever changed or removed: a bridge hlbr0, namespace hlnode<i>, link hlv<i> or directory
#                     /etc/netns/hlnode<i> that exists unrecorded is someone else's, and NODES>=2 refuses.
#   SLURM_SUBNET=10.231.7   the private /24 of those nodes (must be unused here); the bridge is .1
set -euo pipefail
start_time=$(date +%s.%N)

[ "$(id -u)" = 0 ] || { echo "error: run as root (it installs packages and starts daemons)" >&2; exit 1; }
RUN=${SLURM_RUN:-/run/hydralight-slurm}
LOGS=/var/log/slurm
NUM_FAKE_GPUS=${NUM_FAKE_GPUS:-8}
NODE=$(hostname -s)
NODES=${NODES:-1}
[[ "$NODES" =~ ^[1-9][0-9]*$ && "$NODES" -le 200 ]] || { echo "error: NODES must be 1..200, not '$NODES'" >&2; exit 1; }
SUBNET=${SLURM_SUBNET:-10.231.7}
[[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "error: SLURM_SUBNET is the first three numbers of a /24, like 10.231.7" >&2; exit 1; }
BRIDGE=hlbr0 CONTROLLER_ADDR=$SUBNET.1
multi_nodes=()  # the namespaced nodes: hlnode<i>, address $SUBNET.(10+i), veth hlv<i> on the bridge
if [ "$NODES" -ge 2 ]; then multi_nodes=($(seq -f 'hlnode%g' "$NODES")); fi
mkdir -p "$RUN" "$LOGS" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/mysqld /run/munge

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
has_link() { command -v ip >/dev/null && ip link show "$1" >/dev/null 2>&1; }
# The network objects this script makes are recorded in $RUN/KIND.made, a line "NAME ID" each, right after
# making them: KIND bridge (hlbr0), veth (hlv<i>), netns (hlnode<i>), etc-netns-node (/etc/netns/hlnode<i>).
# ID (interface index, namespace or directory inode) tells the object made from a namesake made since by
# someone else. slurm_down.sh has the same functions.
obj_id() {  # obj_id KIND NAME: the ID of what has that name now; nothing if there is none
  case $1 in
    bridge|veth) if command -v ip >/dev/null; then ip -o link show dev "$2" 2>/dev/null | cut -d: -f1 || true; fi ;;
    netns) if [ -e "/run/netns/$2" ]; then stat -L -c %i "/run/netns/$2" 2>/dev/null || true; fi ;;
    etc-netns-node) if [ -e "/etc/netns/$2" ]; then stat -c %i "/etc/netns/$2" 2>/dev/null || true; fi ;;
  esac
}
made() {  # made KIND NAME: NAME is there and is what this script recorded making
  local id; id=$(obj_id "$1" "$2")
  [ -n "$id" ] && grep -qxF "$2 $id" "$RUN/$1.made" 2>/dev/null
}
foreign() { [ -n "$(obj_id "$1" "$2")" ] && ! made "$1" "$2"; }  # foreign KIND NAME: there, not made here
record() {  # record KIND NAME, once it is made
  [ ! -f "$RUN/$1.made" ] || sed -i "/^$2\( \|\$\)/d" "$RUN/$1.made"
  echo "$2 $(obj_id "$1" "$2")" >> "$RUN/$1.made"
}
recorded_nodes() {  # the numbers i of the namespaced nodes with something recorded, or a slurmd pid file
  { cat "$RUN/netns.made" "$RUN/veth.made" "$RUN/etc-netns-node.made" 2>/dev/null
    (cd "$RUN" && ls slurmd-hlnode*.pid 2>/dev/null); } |
    sed -nE 's/^(slurmd-)?(hlnode|hlv)([0-9]+)([ .].*)?$/\3/p' | sort -nu || true
}
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "error: $what did not come up within ${limit}s (logs in $LOGS)" >&2; exit 1
}

# 1. Packages (Debian's SLURM 22.05+; accounting needs slurmdbd + MariaDB, or sacct has nothing to say).
packages="munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $packages >/dev/null
fi
if [ "$NODES" -ge 2 ] && ! command -v ip >/dev/null; then  # network namespaces, veth, bridge
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq iproute2 >/dev/null
fi
if [ "$NODES" -ge 2 ]; then  # the names it needs: free, or taken by what it made itself
  taken=()
  ! foreign bridge "$BRIDGE" || taken+=("bridge $BRIDGE")
  for i in $(seq "$NODES"); do
    ! foreign netns "hlnode$i" || taken+=("network namespace hlnode$i")
    ! foreign veth "hlv$i" || taken+=("link hlv$i")
    ! foreign etc-netns-node "hlnode$i" || taken+=("/etc/netns/hlnode$i")
  done
  [ "${#taken[@]}" = 0 ] || { echo "error: NODES=$NODES needs the names of $(printf '%s, ' "${taken[@]}" |
    sed 's/, $//'), which this script did not make (no record in $RUN/*.made) and so leaves alone: remove what is" \
    "nobody's (ip link del, ip netns del, rm -r) or use NODES=1; nothing changed" >&2; exit 1; }
fi
# Hosts with Docker: br_netfilter with net.bridge.bridge-nf-call-iptables=1 sends the traffic between the nodes
# (bridged, hlv<i> to hlv<j>) through iptables' FORWARD chain, whose policy Docker sets to DROP: the nodes would
# never reach each other and a 2-node job would hang. Refused, with the fix; this script changes no firewall.
if [ "$NODES" -ge 2 ] && [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] &&
   command -v iptables >/dev/null; then
  rules=$( (iptables -S FORWARD; iptables -S DOCKER-USER) 2>/dev/null || true)
  if grep -qx -- '-P FORWARD DROP' <<<"$rules" &&
     ! grep -E -- "^-A (FORWARD|DOCKER-USER) (.* )?-i $BRIDGE( .*)? -j ACCEPT\$" <<<"$rules" | grep -qvE -- '! -i|state'; then
    echo "error: traffic between the nodes on bridge $BRIDGE would be dropped: br_netfilter passes bridged traffic" \
      "to iptables (net.bridge.bridge-nf-call-iptables=1) and the FORWARD policy is DROP (Docker sets it); allow it" \
      "with 'iptables -I FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT' (or sysctl -w net.bridge.bridge-nf-call-iptables=0)" \
      "and run this again; nothing changed" >&2
    exit 1
  fi
fi
if [ "$NODES" -ge 2 ]; then  # a /24 that no route (but the default) or address here touches, but the bridge's
  used=$( (ip -4 route show table all match "$SUBNET.0/24" | grep -v '^default '
           ip -4 route show table all root "$SUBNET.0/24"; ip -4 -o addr show to "$SUBNET.0/24") |
         grep -vw "$BRIDGE" || true)
  [ -z "$used" ] || { echo "error: $SUBNET.0/24 is in use here (choose another SLURM_SUBNET): $used" >&2; exit 1; }
fi

# 2. Configuration, rewritten each time so it matches this machine.
# The machine's CPUs: `nproc` alone would report OMP_NUM_THREADS when it is set.
cpus=$(getconf _NPROCESSORS_ONLN)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
gres_line=""
if [ "$NUM_FAKE_GPUS" -gt 0 ]; then
  # Character devices with /dev/null's numbers: SLURM needs a File= per GPU or marks the node invalid.
  for i in $(seq 0 $((NUM_FAKE_GPUS - 1))); do [ -e "/dev/fakegpu$i" ] || mknod "/dev/fakegpu$i" c 1 3; done
  gres_line="Gres=gpu:$NUM_FAKE_GPUS"
  echo "NodeName=$NODE Name=gpu File=/dev/fakegpu[0-$((NUM_FAKE_GPUS - 1))]" > /etc/slurm/gres.conf
fi
# NODES=1: everything on 127.0.0.1, one slurmd. NODES>=2: the controller is reached at the bridge address
# (from the namespaces too), and each slurmd keeps its pid file, spool dir and log apart (%n: node name).
ctl_addr=127.0.0.1 slurmd_pid=$RUN/slurmd.pid slurmd_spool=/var/spool/slurmd slurmd_log=$LOGS/slurmd.log
partitions="PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
root_slurmd=slurmd  # the name of its pid file in $RUN
if [ "$NODES" -ge 2 ]; then
  ctl_addr=$CONTROLLER_ADDR slurmd_pid=$RUN/slurmd-%n.pid slurmd_spool=/var/spool/slurmd/%n
  slurmd_log=$LOGS/slurmd-%n.log root_slurmd=slurmd-$NODE
  # Each namespaced node: all CPUs (jobs of partition debug may overlap them) and a few GB, enough for
  # a 2-node job of one 1-CPU, 1 GB task per node, or two per node.
  multi_mem_mb=$(( mem_mb < 4096 ? mem_mb : 4096 ))
  partitions="PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=multi Nodes=hlnode[1-$NODES] MaxTime=INFINITE State=UP"
  for node in "$NODE" "${multi_nodes[@]}"; do mkdir -p "/var/spool/slurmd/$node"; done
fi
node_lines="NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb $gres_line State=UNKNOWN"
for i in $(seq "${#multi_nodes[@]}"); do
  node_lines+=$'\n'"NodeName=hlnode$i NodeAddr=$SUBNET.$((10 + i)) CPUs=$cpus RealMemory=$multi_mem_mb State=UNKNOWN"
done
old_conf=$(cat /etc/slurm/slurm.conf 2>/dev/null || true)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$NODE($ctl_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=$slurmd_spool
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$slurmd_log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
# Refuse at submission what the partition can never run, instead of queueing it forever.
EnforcePartLimits=ALL
KillWait=10
MinJobAge=600
MpiDefault=none
$node_lines
$partitions
CONF
# slurmdbd talks to MariaDB over its socket as root (unix-socket auth): no password anywhere.
cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=$NODE
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
CONF
chmod 600 /etc/slurm/slurmdbd.conf

[ "$old_conf" = "$(cat /etc/slurm/slurm.conf)" ] && conf_changed=0 || conf_changed=1

# 3. Daemons, each started once and recorded by pid.
if ! alive munged; then
  chown munge:munge /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid 2>>"$LOGS/munged.log"
  wait_for 10 munge munge -n
  # The daemons write their pid where their own user may; slurm_down.sh reads copies in $RUN.
  cp /run/munge/munged.pid "$RUN/munged.pid"
fi
wait_for 10 munge munge -n

if ! alive mariadbd; then
  chown mysql:mysql /run/mysqld
  rm -f /run/mysqld/mariadbd.pid
  setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mariadbd.pid --socket=/run/mysqld/mysqld.sock \
    >>"$LOGS/mariadbd.log" 2>&1 < /dev/null &
  wait_for 30 MariaDB mariadb -e "select 1"
  cp /run/mysqld/mariadbd.pid "$RUN/mariadbd.pid"
fi
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db"

if ! alive slurmdbd; then
  /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
fi
# A changed configuration needs fresh SLURM daemons (some settings are read at start only).
if [ "$conf_changed" = 1 ]; then
  # Every slurmd: this machine's (slurmd.pid, or slurmd-$NODE.pid with NODES>=2) and the namespaced ones.
  # All of them at once, then the controller.
  daemons=$(cd "$RUN" && for f in slurmd.pid slurmd-*.pid; do [ ! -f "$f" ] || echo "${f%.pid}"; done)
  for group in "$daemons" slurmctld; do
    pids=$(for daemon in $group; do alive "$daemon" && cat "$RUN/$daemon.pid"; done || true)
    [ -z "$pids" ] || kill -TERM $pids
    for pid in $pids; do
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    done
  done
  for daemon in $daemons; do alive "$daemon" || rm -f "$RUN/$daemon.pid"; done
fi

# 4. Namespaced nodes made earlier and not wanted now (NODES=1: all of them, and the bridge) go: their
#    slurmd, and what this script made of them (what still runs in their namespace, the namespace, its link,
#    /etc/netns/<node>; the bridge).
keep=$NODES; [ "$NODES" -ge 2 ] || keep=0
shrink=0
if [ "$keep" = 0 ] && [ -s "$RUN/bridge.made" ]; then shrink=1; fi
for i in $(recorded_nodes); do [ "$i" -le "$keep" ] || shrink=1; done
if [ "$shrink" = 1 ]; then bash "$(dirname "$0")/slurm_down.sh" --nodes-above "$keep"; fi

# 5. NODES>=2: the network of the namespaced nodes. A bridge hlbr0 ($CONTROLLER_ADDR/24) in this namespace;
#    per node a namespace hlnode<i> whose eth0 ($SUBNET.(10+i)/24) is a veth pair with hlv<i> on the bridge.
#    No default route and no IPv6 there: a node reaches its own loopback and this /24, nothing else.
#    /etc/netns/hlnode<i>/hosts, mounted over /etc/hosts for the node's slurmd (as `ip netns exec` does), names
#    every node and the controller, so a node's hostname resolves to its own address (gloo, Lightning's
#    MASTER_ADDR) and never to loopback. What exists of these was made here (checked in step 1); what is made
#    now is recorded at once.
no_ipv6() {  # no_ipv6 NETNS DEVICE (NETNS "": this one)
  local knob=/proc/sys/net/ipv6/conf/$2/disable_ipv6
  if [ -z "$1" ]; then [ ! -w "$knob" ] || echo 1 > "$knob"
  else nsenter --net="/run/netns/$1" sh -c "[ ! -w $knob ] || echo 1 > $knob"; fi
}
only_address() {  # only_address NETNS DEVICE ADDRESS/24 (NETNS "": this one)
  local ip=(ip); [ -z "$1" ] || ip=(ip -n "$1")
  if [ "$("${ip[@]}" -4 -o addr show dev "$2" | awk '{print $4}')" != "$3" ]; then
    "${ip[@]}" addr flush dev "$2"
    "${ip[@]}" addr add "$3" dev "$2"
  fi
}
if [ "$NODES" -ge 2 ]; then
  if ! has_link "$BRIDGE"; then ip link add "$BRIDGE" type bridge; record bridge "$BRIDGE"; fi
  [ -d /etc/netns ] || { mkdir /etc/netns; touch "$RUN/etc-netns.made"; }  # slurm_down.sh removes it then
  no_ipv6 "" "$BRIDGE"
  only_address "" "$BRIDGE" "$CONTROLLER_ADDR/24"
  ip link set "$BRIDGE" up
  hosts=$(printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n' "$CONTROLLER_ADDR" "$NODE"
          for i in $(seq "$NODES"); do printf '%s\thlnode%s\n' "$SUBNET.$((10 + i))" "$i"; done)
  for i in $(seq "$NODES"); do
    node=hlnode$i
    if [ ! -e "/run/netns/$node" ]; then ip netns add "$node"; record netns "$node"; fi
    if ! has_link "hlv$i"; then ip link add "hlv$i" type veth peer name eth0 netns "$node"; record veth "hlv$i"; fi
    no_ipv6 "" "hlv$i"
    ip link set "hlv$i" master "$BRIDGE" up
    no_ipv6 "$node" eth0
    only_address "$node" eth0 "$SUBNET.$((10 + i))/24"
    ip -n "$node" link set eth0 up
    ip -n "$node" link set lo up
    if [ ! -e "/etc/netns/$node" ]; then mkdir "/etc/netns/$node"; record etc-netns-node "$node"; fi
    # Rewritten in place: a running slurmd's namespace has this very file mounted over /etc/hosts.
    [ "$(cat "/etc/netns/$node/hosts" 2>/dev/null)" = "$hosts" ] || echo "$hosts" > "/etc/netns/$node/hosts"
  done
fi

# 6. SLURM daemons.
if ! alive slurmctld; then
  /usr/sbin/slurmctld
  wait_for 30 slurmctld scontrol ping
fi
if ! alive "$root_slurmd"; then
  /usr/sbin/slurmd -N "$NODE"
fi
for node in "${multi_nodes[@]}"; do
  alive "slurmd-$node" && continue
  # The node's network namespace, its own UTS namespace (hostname = node name) and a mount namespace whose
  # /etc/hosts is /etc/netns/<node>/hosts; its job steps inherit all three. Not `ip netns exec`: that mounts
  # a new /sys, without the cgroup file systems slurmd needs.
  nsenter --net="/run/netns/$node" unshare --uts --mount --propagation slave -- sh -c \
    'mount --bind "/etc/netns/$1/hosts" /etc/hosts && echo "$1" > /proc/sys/kernel/hostname && exec /usr/sbin/slurmd -N "$1"' \
    sh "$node"
done
wait_for 30 "node $NODE" bash -c "sinfo -h -n $NODE -o %t | grep -Eq '^(idle|mix|alloc)'"
# A node drained by an earlier bad configuration stays drained until told otherwise.
if sinfo -h -n "$NODE" -o %t | grep -Eq 'drain|inval'; then scontrol update nodename="$NODE" state=resume; fi
echo "SLURM cluster 'local' up: node $NODE, $cpus CPUs, ${mem_mb} MB, $NUM_FAKE_GPUS fake GPUs, partition debug"
if [ "$NODES" -ge 2 ]; then
  nodelist=hlnode[1-$NODES]
  registered() { [ "$(sinfo -h -N -n "$nodelist" -o %t | grep -Ec "^($1)\$")" = "$NODES" ]; }
  wait_for 30 "nodes $nodelist" registered 'idle|mix|alloc|drain|drng|inval'
  if ! registered 'idle|mix|alloc'; then
    scontrol update nodename="$nodelist" state=resume 2>/dev/null || true
    wait_for 30 "nodes $nodelist (drained)" registered 'idle|mix|alloc'
  fi
  echo "partition multi: $NODES nodes $nodelist ($SUBNET.11-$((10 + NODES)), own network and hostname each, on bridge" \
    "$BRIDGE $CONTROLLER_ADDR), $cpus CPUs, ${multi_mem_mb} MB each; up in $(awk -v s="$start_time" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')s"
fi

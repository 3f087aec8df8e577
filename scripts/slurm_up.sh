#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster (controller, node daemon, accounting) on this Debian/Ubuntu
# machine, as root, without systemd. Idempotent: what already runs is left alone. Try sweeps here
# before sending them to a real cluster; the test suite uses it too. Stop it with scripts/slurm_down.sh.
#
#   NUM_FAKE_GPUS=8   GPUs declared as gres (fake devices) so GPU requests can be submitted and checked
#   SLURM_RUN=/run/hydralight-slurm   where pid files live (slurm_down.sh reads them)
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "error: run as root (it installs packages and starts daemons)" >&2; exit 1; }
RUN=${SLURM_RUN:-/run/hydralight-slurm}
LOGS=/var/log/slurm
NUM_FAKE_GPUS=${NUM_FAKE_GPUS:-8}
NODE=$(hostname -s)
mkdir -p "$RUN" "$LOGS" /var/spool/slurmctld /var/spool/slurmd /etc/slurm /run/mysqld /run/munge

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
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

# 2. Configuration, rewritten each time so it matches this machine.
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
gres_line=""
if [ "$NUM_FAKE_GPUS" -gt 0 ]; then
  # Character devices with /dev/null's numbers: SLURM needs a File= per GPU or marks the node invalid.
  for i in $(seq 0 $((NUM_FAKE_GPUS - 1))); do [ -e "/dev/fakegpu$i" ] || mknod "/dev/fakegpu$i" c 1 3; done
  gres_line="Gres=gpu:$NUM_FAKE_GPUS"
  echo "NodeName=$NODE Name=gpu File=/dev/fakegpu[0-$((NUM_FAKE_GPUS - 1))]" > /etc/slurm/gres.conf
fi
old_conf=$(cat /etc/slurm/slurm.conf 2>/dev/null || true)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
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
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb $gres_line State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
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
  for daemon in slurmd slurmctld; do
    alive "$daemon" || continue
    pid=$(cat "$RUN/$daemon.pid"); kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  done
fi
if ! alive slurmctld; then
  /usr/sbin/slurmctld
  wait_for 30 slurmctld scontrol ping
fi
if ! alive slurmd; then
  /usr/sbin/slurmd -N "$NODE"
fi
wait_for 30 "node $NODE" bash -c "sinfo -h -n $NODE -o %t | grep -Eq '^(idle|mix|alloc)'"
# A node drained by an earlier bad configuration stays drained until told otherwise.
if sinfo -h -n "$NODE" -o %t | grep -Eq 'drain|inval'; then scontrol update nodename="$NODE" state=resume; fi
echo "SLURM cluster 'local' up: node $NODE, $cpus CPUs, ${mem_mb} MB, $NUM_FAKE_GPUS fake GPUs, partition debug"

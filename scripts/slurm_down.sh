#!/usr/bin/env bash
# Stop the daemons scripts/slurm_up.sh started, by the pid files it wrote (never by name).
set -uo pipefail
RUN=${SLURM_RUN:-/run/hydralight-slurm}
for daemon in slurmd slurmctld slurmdbd mariadbd munged; do
  pidfile="$RUN/$daemon.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "stopped $daemon ($pid)"
  fi
  rm -f "$pidfile"
done

#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying and testing minillm's cluster path (docs/scaling.md):
#   bash scripts/slurm_cluster.sh start    # install (as root, Debian's packages), configure, start; wait until idle
#   bash scripts/slurm_cluster.sh status   # one line: the node's state, or why there is no cluster
#   bash scripts/slurm_cluster.sh stop     # stop the daemons this script started (a cluster of its own: untouched)
# start writes /etc/slurm/slurm.conf for this machine (its CPUs and memory, from `slurmd -C`; no accounting),
# starts munged, slurmctld and slurmd (state, logs and pid files in $SLURM_CLUSTER_DIR, default
# /var/lib/minillm-slurm) and waits until `sinfo` shows the node idle. Safe to run again: a running cluster is left
# as it is, a changed machine gets a new slurm.conf and a restart. A slurm.conf this script did not write (a real
# cluster's) is never replaced. Every failure is one line "slurm_cluster: <reason>" and exit status 1.
set -uo pipefail
STATE=${SLURM_CLUSTER_DIR:-/var/lib/minillm-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by minillm's scripts/slurm_cluster.sh"
PACKAGES=(slurmctld slurmd slurm-client munge)
WAIT_S=${SLURM_CLUSTER_WAIT_S:-60}

fail() { echo "slurm_cluster: $*" >&2; exit 1; }
have_tools() { command -v slurmctld && command -v slurmd && command -v sinfo && command -v munged; } >/dev/null
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { timeout 10 sinfo -h -o %t 2>/dev/null | head -1; }

install() {
  have_tools && return 0
  [ "$(id -u)" = 0 ] || fail "SLURM is not installed, and installing it needs root (apt-get install ${PACKAGES[*]})"
  command -v apt-get >/dev/null || fail "SLURM is not installed and there is no apt-get here (install ${PACKAGES[*]})"
  local log=/tmp/slurm_cluster_install.log
  { timeout 600 apt-get update -q && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q \
      --no-install-recommends "${PACKAGES[@]}"; } >"$log" 2>&1 \
    || fail "could not install ${PACKAGES[*]} with apt-get ($(tail -1 "$log"); full log: $log)"
  have_tools || fail "apt-get installed ${PACKAGES[*]} but slurmctld, slurmd, sinfo or munged is still missing"
}

write_conf() {
  local node host
  node=$(slurmd -C 2>/dev/null | grep '^NodeName=') || fail "slurmd -C could not read this machine's CPUs and memory"
  host=$(hostname -s)
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    fail "$CONF exists and was not written by this script (this machine has a SLURM set-up of its own): left alone"
  fi
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  cat >"$CONF.new" <<EOF
$MARK for $host (one node; no accounting: sacct answers nothing)
ClusterName=minillm
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
ReturnToService=2
KillWait=30
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  if cmp -s "$CONF.new" "$CONF"; then rm "$CONF.new"; return 1; fi  # 1: unchanged
  mv "$CONF.new" "$CONF"
}

start_munge() {
  if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  runuser -u munge -- munged 2>"$STATE/munged.err" || fail "munged did not start: $(tail -1 "$STATE/munged.err")"
}

stop_daemons() {
  local pid
  for name in slurmd slurmctld; do
    alive "$STATE/$name.pid" || continue
    pid=$(cat "$STATE/$name.pid")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  done
}

start() {
  install
  [ "$(id -u)" = 0 ] || fail "starting the cluster needs root (slurmd runs the jobs as their users)"
  mkdir -p "$STATE"
  if write_conf; then stop_daemons; fi  # a new or changed slurm.conf: (re)start with it
  start_munge
  alive "$STATE/slurmctld.pid" || slurmctld || fail "slurmctld did not start: $(tail -1 "$STATE/slurmctld.log")"
  alive "$STATE/slurmd.pid" || slurmd || fail "slurmd did not start: $(tail -1 "$STATE/slurmd.log")"
  local state=""
  for _ in $(seq $((WAIT_S * 2))); do
    state=$(node_state)
    case "$state" in
      idle|mix|alloc) echo "slurm_cluster: $(status_line)"; return 0 ;;
      down*|drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 ;;
    esac
    sleep 0.5
  done
  fail "the node is not idle after ${WAIT_S}s (sinfo: ${state:-no answer}; logs: $STATE/slurmctld.log, slurmd.log)"
}

status_line() {
  sinfo -h -N -o "node %N %t, %c CPUs, %m MB memory, partition %P" 2>/dev/null | head -1
}

status() {
  command -v sinfo >/dev/null || fail "SLURM is not installed (bash scripts/slurm_cluster.sh start installs it as root)"
  local state
  state=$(node_state)
  [ -n "$state" ] || fail "no cluster answers (bash scripts/slurm_cluster.sh start starts one)"
  echo "slurm_cluster: $(status_line)$(grep -qsF "$MARK" "$CONF" || echo " (not started by this script)")"
}

case "${1:-}" in
  start) start ;;
  status) status ;;
  stop) stop_daemons; echo "slurm_cluster: stopped the daemons started from $STATE (munged left running)" ;;
  *) echo "usage: bash scripts/slurm_cluster.sh start|status|stop" >&2; exit 2 ;;
esac

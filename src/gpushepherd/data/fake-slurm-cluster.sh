#!/bin/bash
# A Slurm 22.05 cluster (Debian's slurm-wlm) of N fake 8-GPU nodes on 127.0.0.1, for tests
# and demos of `shepherd server --backend slurm` (design note 013). Run as root.
#
#   fake-cluster.sh start DIR [NODES]   config, state and logs in DIR (absolute); prints
#                                       `export SLURM_CONF=DIR/slurm.conf`
#   fake-cluster.sh stop DIR            stops what `start DIR` started, by its pid files
#
# Ports: $SLURM_CTLD_PORT (default 16817) and $SLURM_NODE_PORT+n (default 17000+n).
# $SLURM_EXTRA_CONF: lines added to slurm.conf (e.g. PreemptType=...); $SLURM_PARTITIONS:
# partition lines replacing the default one (the first partition is the one waited on).
# Fake GPUs are gres.conf File= entries symlinked to /dev/null (they must be character
# devices; plain files leave CUDA_VISIBLE_DEVICES empty). Partition `shepherd` is the one
# gpushepherd owns; nothing else submits to it.
set -euo pipefail
cmd=${1:-}; D=${2:-}
case "$D" in /*) ;; *) echo "usage: $0 start|stop ABSOLUTE_DIR [NODES]" >&2; exit 2 ;; esac

user_key() { printf '%s' "$D" | md5sum | cut -c1-16; }

stop() {
    for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    # munged is shared by the fake clusters running at once (the test suite runs two
    # side by side): the last one to stop stops it, if a fake cluster started it
    if [ -d /run/munge ]; then
        exec 9>/run/munge/fake-clusters.lock && flock 9
        rm -f "/run/munge/fake-clusters/$(user_key)" "$D/munged.started"
        if [ -f /run/munge/fake-started ] && [ -z "$(ls -A /run/munge/fake-clusters 2>/dev/null)" ]; then
            [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
            rm -f /run/munge/fake-started
        fi
        flock -u 9
    fi
    for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid; do  # wait for them to go (at most 10 s)
        [ -f "$f" ] || continue
        for _ in $(seq 1 100); do kill -0 "$(cat "$f" 2>/dev/null)" 2>/dev/null || break; sleep 0.1; done
        rm -f "$f"
    done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop ABSOLUTE_DIR [NODES]" >&2; exit 2; }
command -v slurmctld >/dev/null || { echo "no slurmctld: apt-get install slurm-wlm" >&2; exit 3; }
N=${3:-2}; H=$(hostname -s); CP=${SLURM_CTLD_PORT:-16817}; NP=${SLURM_NODE_PORT:-17000}
rm -rf "$D"; mkdir -p "$D"/state "$D"/spool "$D"/log "$D"/dev
for i in $(seq 0 7); do ln -s /dev/null "$D/dev/nvidia$i"; done
cat > "$D/slurm.conf" <<CONF
ClusterName=fake
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=$CP
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
PriorityType=priority/multifactor
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
KillWait=5
MinJobAge=600
CONF
for n in $(seq 1 "$N"); do
    echo "NodeName=fake$n NodeHostname=$H NodeAddr=127.0.0.1 Port=$((NP + n)) CPUs=16 RealMemory=64000 Gres=gpu:a100:8 Feature=rack$(( (n + 1) / 2 )) State=UNKNOWN" >> "$D/slurm.conf"
done
[ -n "${SLURM_EXTRA_CONF:-}" ] && printf '%s\n' "$SLURM_EXTRA_CONF" >> "$D/slurm.conf"
PARTS=${SLURM_PARTITIONS:-PartitionName=shepherd Nodes=ALL Default=YES MaxTime=INFINITE State=UP}
printf '%s\n' "$PARTS" >> "$D/slurm.conf"
P1=$(printf '%s\n' "$PARTS" | sed -n 's/^PartitionName=\([^ ]*\).*/\1/p' | head -1)
printf 'AutoDetect=off\nNodeName=fake[1-%s] Name=gpu Type=a100 File=%s/dev/nvidia[0-7]\n' "$N" "$D" > "$D/gres.conf"
export SLURM_CONF=$D/slurm.conf  # absolute, or job steps hang
mkdir -p /run/munge && chown munge:munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 600 /etc/munge/munge.key
fi
exec 9>/run/munge/fake-clusters.lock && flock 9  # see stop()
mkdir -p /run/munge/fake-clusters && touch "/run/munge/fake-clusters/$(user_key)"
if [ ! -S /run/munge/munge.socket.2 ] || ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged && touch /run/munge/fake-started
fi
flock -u 9
slurmctld -f "$SLURM_CONF" -i
for n in $(seq 1 "$N"); do slurmd -f "$SLURM_CONF" -N "fake$n"; done
for _ in $(seq 1 240); do
    [ "$(sinfo -h -N -p "$P1" -o %T 2>/dev/null | grep -c '^idle')" = "$N" ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.5
done
echo "the fake cluster did not come up in 120 s; see $D/log" >&2
stop; exit 1

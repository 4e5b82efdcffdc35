#!/usr/bin/env bash
# Start a SLURM cluster on this machine (CI, or to try the scripts in slurm/ anywhere), as root:
#   sudo bash slurm/ci/start_cluster.sh
# Installs Debian's slurm-wlm and munge if missing, writes /etc/slurm/{slurm,gres}.conf from slurm/ci/, starts
# munged, slurmctld and two slurmd (nodes `hostname` and `localhost`, both on this machine), and waits until
# both nodes are idle and a two-node srun works. Exits non-zero, with the daemons' last log lines, when it
# cannot. Safe to run again: daemons that already run with the same config are kept. Refuses to overwrite an
# /etc/slurm/slurm.conf that it did not write. Environment: WAIT_S (default 90) seconds to wait for the nodes.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MARKER="# written by slurm/ci/start_cluster.sh"
WAIT_S="${WAIT_S:-90}"
HOST="$(hostname)"
NODES=("$HOST" localhost)   # must match the NodeName lines of slurm.conf

fail() {
    echo "start_cluster: $*" >&2
    for log in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log; do
        [[ -f "$log" ]] && { echo "--- last lines of $log" >&2; tail -n 15 "$log" >&2; }
    done
    exit 1
}

[[ "$(id -u)" == 0 ]] || fail "run as root (the daemons and apt-get need it)"
[[ "$HOST" != localhost ]] || fail "this machine's hostname is 'localhost', the name of the second node"

# 1. Packages. Debian's postinst also creates /etc/munge/munge.key.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "start_cluster: installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed"
    apt-get install -y -qq slurm-wlm munge >/dev/null || fail "apt-get install slurm-wlm munge failed"
fi

# 2. The config, with this machine's name and CPU count.
mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/log/slurm
if [[ -f /etc/slurm/slurm.conf ]] && ! grep -qF "$MARKER" /etc/slurm/slurm.conf; then
    fail "/etc/slurm/slurm.conf exists and was not written by this script (a real cluster?); not touching it"
fi
rendered="$(mktemp -d)"
for name in slurm.conf gres.conf; do
    {
        echo "$MARKER from $HERE/$name"
        sed -e "s/@NODE@/$HOST/g" -e "s/@CPUS@/$(nproc)/g" "$HERE/$name"
    } >"$rendered/$name"
done
config_changed=0
for name in slurm.conf gres.conf; do
    cmp -s "$rendered/$name" "/etc/slurm/$name" || config_changed=1
    install -m 0644 "$rendered/$name" "/etc/slurm/$name"
done
rm -rf "$rendered"

# Daemons started earlier by this script are known by their pid files; nothing else is ever stopped.
running() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
    running "$1" || return 0
    local pid
    pid="$(cat "$1")"
    kill "$pid"
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
}

# 3. munge: authenticates every message between the SLURM commands and daemons.
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_works; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
    for _ in $(seq 50); do munge_works && break; sleep 0.2; done
    munge_works || fail "munge does not work (see /var/log/munge/munged.log)"
fi

# 4. slurmctld (the controller) and one slurmd per node; all restarted when the config changed.
if [[ "$config_changed" == 1 ]]; then
    for pidfile in /run/slurmd*.pid /run/slurmctld.pid; do stop "$pidfile"; done
fi
if ! running /run/slurmctld.pid; then
    # -c: start from a clean state (no jobs or node states left from an earlier run)
    /usr/sbin/slurmctld -c || fail "slurmctld did not start"
fi
for node in "${NODES[@]}"; do
    mkdir -p "/var/lib/slurm/slurmd-$node"
    running "/run/slurmd-$node.pid" || /usr/sbin/slurmd -N "$node" || fail "slurmd for node $node did not start"
done

# 5. Wait for the nodes: idle (or already running jobs); resume a node left down or drained by an earlier run.
deadline=$((SECONDS + WAIT_S))
while true; do
    not_ready=()
    for node in "${NODES[@]}"; do
        state="$(sinfo --noheader --nodes="$node" --format=%t 2>/dev/null | head -n1 || true)"
        case "$state" in
            idle | mix | alloc) ;;
            down* | drain* | drng* | fail* | inval*)
                scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
                not_ready+=("$node=$state")
                ;;
            *) not_ready+=("$node=${state:-unlisted}") ;;
        esac
    done
    ((${#not_ready[@]} == 0)) && break
    ((SECONDS < deadline)) || fail "nodes not idle after ${WAIT_S}s: ${not_ready[*]}"
    sleep 1
done

# 6. Prove that job steps really run, on both nodes.
# shellcheck disable=SC2016  # $SLURMD_NODENAME is expanded by the job, not here
out="$(timeout 60 srun --partition=gpu --nodes=2 --ntasks-per-node=1 --time=1 --job-name=start_cluster-check \
    bash -c 'echo $SLURMD_NODENAME' 2>&1)" || fail "a two-node srun did not run: $out"
echo "start_cluster: SLURM is up, $(nproc) CPUs per node; srun ran on: ${out//$'\n'/ }"
sinfo

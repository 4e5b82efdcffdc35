#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (CI, or to try the scripts in slurm/ anywhere), as root:
#   sudo bash slurm/ci/start_cluster.sh
# Installs Debian's slurm-wlm and munge if missing, writes /etc/slurm/slurm.conf from slurm/ci/slurm.conf,
# starts munged, slurmctld and slurmd, and waits until the node is idle and a one-task srun works.
# Exits non-zero, with the daemons' last log lines, when it cannot. Safe to run again: daemons that already run
# with the same config are kept. Refuses to overwrite an /etc/slurm/slurm.conf that it did not write.
# Environment: WAIT_S (default 90) seconds to wait for the node.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF=/etc/slurm/slurm.conf
MARKER="# written by slurm/ci/start_cluster.sh"
WAIT_S="${WAIT_S:-90}"
NODE="$(hostname)"

fail() {
    echo "start_cluster: $*" >&2
    for log in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; do
        [[ -f "$log" ]] && { echo "--- last lines of $log" >&2; tail -n 15 "$log" >&2; }
    done
    exit 1
}

[[ "$(id -u)" == 0 ]] || fail "run as root (the daemons and apt-get need it)"

# 1. Packages. Debian's postinst also creates /etc/munge/munge.key and the slurm state directories.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "start_cluster: installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed"
    apt-get install -y -qq slurm-wlm munge >/dev/null || fail "apt-get install slurm-wlm munge failed"
fi

# 2. The config: this machine as the only node, all its CPUs.
mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
if [[ -f "$CONF" ]] && ! grep -qF "$MARKER" "$CONF"; then
    fail "$CONF exists and was not written by this script (a real cluster?); not touching it"
fi
rendered="$(mktemp)"
{
    echo "$MARKER from $HERE/slurm.conf"
    sed -e "s/@NODE@/$NODE/g" -e "s/@CPUS@/$(nproc)/g" "$HERE/slurm.conf"
} >"$rendered"
config_changed=1
if [[ -f "$CONF" ]] && cmp -s "$rendered" "$CONF"; then
    config_changed=0
fi
install -m 0644 "$rendered" "$CONF"
rm -f "$rendered"

# A daemon we started earlier is known by its pid file; nothing else is ever stopped.
running() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
    if running "$1"; then
        local pid
        pid="$(cat "$1")"
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
    fi
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
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
    munge -n </dev/null | unmunge >/dev/null || fail "munge does not work (see /var/log/munge/munged.log)"
fi

# 4. slurmctld (the controller) and slurmd (the node daemon), restarted when the config changed.
if [[ "$config_changed" == 1 ]]; then
    stop /run/slurmd.pid
    stop /run/slurmctld.pid
fi
if ! running /run/slurmctld.pid; then
    # -c: start from a clean state (no jobs or node states left from an earlier run)
    /usr/sbin/slurmctld -c || fail "slurmctld did not start"
fi
if ! running /run/slurmd.pid; then
    /usr/sbin/slurmd || fail "slurmd did not start"
fi

# 5. Wait for the node: idle (or already running jobs), resuming it if an earlier run left it down/drained.
deadline=$((SECONDS + WAIT_S))
state=""
while ((SECONDS < deadline)); do
    state="$(sinfo --noheader --nodes="$NODE" --format=%t 2>/dev/null | head -n1 || true)"
    case "$state" in
        idle | mix | alloc) break ;;
        down* | drain* | drng* | fail*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
[[ "$state" =~ ^(idle|mix|alloc)$ ]] || fail "node $NODE is '${state:-not listed}' after ${WAIT_S}s, not idle"

# 6. Prove that a job step really runs.
out="$(timeout 60 srun --nodes=1 --ntasks=1 --time=1 --job-name=start_cluster-check hostname 2>&1)" \
    || fail "a one-task srun did not run: $out"
echo "start_cluster: SLURM is up: node $NODE ($(nproc) CPUs) is $state; srun ran on $out"
sinfo

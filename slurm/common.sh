# Shared by the slurm/*.sbatch scripts (sourced, never run or submitted by itself).
# Reads every setting from the environment, with a default, so that nothing needs editing (sbatch passes the
# submitting shell's environment to the job; `sbatch --export=ALL,A=1` works too, but splits values at commas):
#   CONFIG=configs/precision/bf16-mixed.yaml RUN_DIR=runs/exp1 sbatch slurm/gpu.sbatch
#
#   REPO        the project (default: the directory sbatch was called from)
#   CLI_MODULE  the project's command line, run as `python -m $CLI_MODULE fit` (default: src.cli)
#   CONFIG      config file(s) for --config, space-separated, read after configs/default.yaml (default: set by
#               each script; empty: none)
#   RUN_DIR     the run directory: checkpoints, logs, wandb id (default: runs/<job name>-<job id>, which stays
#               the same when the job is requeued, so a requeued job finds its own checkpoint)
#   EXTRA_ARGS  more CLI options, e.g. "--trainer.max_steps=1000 --data.init_args.batch_size=512"
#   ACCELERATOR gpu or cpu (default: set by each script)
#   DEVICES     --trainer.devices (default: tasks per node of the allocation)
#   NUM_NODES   --trainer.num_nodes (default: nodes of the allocation)
#   VENV        virtual environment to activate (default: $REPO/.venv if it exists)
#   MODULES     environment modules to `module load` first, e.g. "cuda/12.4 nccl" (default: none)
#   SRUN_ARGS   more srun options, e.g. "--kill-on-bad-exit=1" (default: none)
#   REQUEUE     1: requeue the job after a preemption checkpoint (default: 1; needs #SBATCH --requeue)
# shellcheck shell=bash

set -uo pipefail  # no -e: the exit status of srun is handled below

log() { echo "[$(date +%H:%M:%S) ${SLURM_JOB_ID:-nojob}] $*"; }

# sbatch runs a copy of the script from SLURM's spool directory: find the project from the submit directory.
cd "$REPO" || exit 2
CLI_MODULE="${CLI_MODULE:-src.cli}"
if [[ ! -f "${CLI_MODULE//.//}.py" ]]; then
    log "error: $REPO is not the project (no ${CLI_MODULE//.//}.py). Fix: submit from the project root or set REPO=<project dir>."
    exit 2
fi

# The software environment, as on the login node.
if [[ -n "${MODULES:-}" ]]; then
    # shellcheck disable=SC2086  # several module names
    module load $MODULES
fi
VENV="${VENV:-$REPO/.venv}"
if [[ -f "$VENV/bin/activate" ]]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
export PYTHONUNBUFFERED=1                                # log lines appear in the .out file as they happen
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"  # one thread per allocated core

# The run directory must not change when the job is requeued: SLURM keeps the job id, so derive it from that.
if [[ -n "${SLURM_ARRAY_JOB_ID:-}" ]]; then
    JOB_TAG="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
else
    JOB_TAG="${SLURM_JOB_ID}"
fi
RUN_DIR="${RUN_DIR:-runs/${SLURM_JOB_NAME}-${JOB_TAG}}"

# One process per task; Lightning reads ranks, node rank and the master address from srun's environment.
NODES_ALLOCATED="${SLURM_JOB_NUM_NODES:-1}"
TASKS_PER_NODE="${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-1} / NODES_ALLOCATED))}"
DEVICES="${DEVICES:-$TASKS_PER_NODE}"
NUM_NODES="${NUM_NODES:-$NODES_ALLOCATED}"

# The batch shell itself must survive SIGUSR1 (`scancel --full --signal=USR1`, `--signal=B:USR1@90`):
# the training processes handle it, and this script has to be alive to see their exit status.
trap 'log "batch shell: got SIGUSR1; the training processes save and stop at the next step"' USR1

# train ARGS...: run `python -m $CLI_MODULE fit` once per task, resuming from RUN_DIR if it holds a checkpoint.
# Exit status 75 means: preempted, last.ckpt saved; then the job is requeued and comes back here.
train() {
    local config_args=() file
    for file in ${CONFIG:-}; do config_args+=(--config "$file"); done
    # shellcheck disable=SC2206  # EXTRA_ARGS and SRUN_ARGS are word lists on purpose
    local command=(
        srun ${SRUN_ARGS:-}
        --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"  # since SLURM 22.05 srun does not inherit it from sbatch
        python -m "$CLI_MODULE" fit
        "${config_args[@]}"
        --trainer.accelerator="$ACCELERATOR"
        --trainer.strategy=ddp                    # srun started the processes; ddp_spawn would start more
        --trainer.devices="$DEVICES"
        --trainer.num_nodes="$NUM_NODES"
        --trainer.default_root_dir="$RUN_DIR"
        --ckpt_path=last                          # resume if RUN_DIR has last.ckpt, else start fresh
        --preemption.requeue=false                # this script requeues, after every rank has exited
        "$@"
        ${EXTRA_ARGS:-}
    )
    log "job ${JOB_TAG} on ${SLURM_JOB_NODELIST:-?}, start #$((${SLURM_RESTART_COUNT:-0} + 1)), run dir $RUN_DIR"
    log "${command[*]}"
    "${command[@]}"
    local status=$?
    if [[ "$status" == 75 ]]; then
        if [[ "${REQUEUE:-1}" == 1 ]]; then
            log "preempted: last.ckpt saved in $RUN_DIR/checkpoints; requeueing job ${JOB_TAG}"
            # requeue ends this script (SIGTERM); the job comes back with the same id and RUN_DIR
            scontrol requeue "$JOB_TAG" || log "scontrol requeue failed: resubmit with RUN_DIR=$RUN_DIR"
        else
            log "preempted: last.ckpt saved; resume with: sbatch --export=ALL,RUN_DIR=$RUN_DIR <this script>"
        fi
    elif [[ "$status" == 143 || "$status" == 130 ]]; then
        log "stopped by SIGTERM or SIGINT (scancel, Ctrl-C): last.ckpt saved; resume with: RUN_DIR=$RUN_DIR sbatch <this script>"
    elif [[ "$status" != 0 ]]; then
        log "training failed with exit status $status (2: a configuration error, see the message above)"
    else
        log "done: $RUN_DIR"
    fi
    return "$status"
}

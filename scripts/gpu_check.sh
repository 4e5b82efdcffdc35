#!/usr/bin/env bash
# The GPU check: one script for a machine with a CUDA GPU, torch, lightning, torchmetrics, rich, tensorboard,
# matplotlib and pytest, and no network. It installs what else the engine and its tests need from the wheels in
# scripts/gpu_wheels/ (jsonargparse with its signatures extras docstring-parser and typeshed-client, pytest-xdist
# and execnet, pytest-timeout, setuptools for building the project; pure Python, committed, about 2 MB) into a
# folder of its own on PYTHONPATH (GPU_CHECK_SITE, default /tmp/gpu_check_site), with
# `pip install --no-index --no-deps --target`, only those the python lacks, and the project with
# `pip install --no-deps -e .` (pyproject's torch floor is not checked, so an older torch runs as it is).
#
# Usage: bash scripts/gpu_check.sh [OUTPUT_DIR]           (default: gpu_check/; every output goes there)
#        GPU_CHECK_DRY_RUN=1 bash scripts/gpu_check.sh DIR (every part on the CPU, tiny sizes: the plumbing only;
#                                                          bench_image plans its rows, bench_gpt runs the same code)
#        GPU_CHECK_PARTS="mfu stall" bash scripts/gpu_check.sh DIR   (only those parts, after the setup)
#
# Outputs are small (logs, JSON, reports); the runs' own folders (checkpoints of an 86M-parameter model among them)
# go to GPU_CHECK_SCRATCH (default /tmp/gpu_check_runs), and OUTPUT_DIR/outputs.tgz holds every output in one file.
#
# Parts, each under its own timeout (seconds; the variable overrides it). On one H200 (torch 2.11) each training
# process takes 15 to 19 s before its first step, so the whole check takes about 10 minutes; it also runs in
# two commands (the second finds the wheels installed):
#   GPU_CHECK_PARTS="gpu_tests users syncs mfu nvtx" bash scripts/gpu_check.sh DIR    (about 5 minutes)
#   GPU_CHECK_PARTS="bench_gpt stall bench_image" bash scripts/gpu_check.sh DIR2 (about 6 minutes)
#   setup       (30)  the wheels, the machine and versions: machine.txt
#   -- correctness, run side by side (none of them is timed):
#   gpu_tests   (150) tests/workflows/test_gpu.py and tests/examples/test_gpu_model_parallel.py (-m gpu, 4 workers)
#   users       (150) the tests' user-style models (tests/zoo: a regression MLP with DataLoader workers, a GAN with
#                     manual optimization and an IterableDataset) under dp in 16-mixed and bf16-mixed, 30 steps
#   syncs       (150) host-device synchronisations per training step after warm-up (scripts/sync_count.py:
#                     torch.cuda.set_sync_debug_mode("warn"), default callbacks, CSV logging, progress bar) under
#                     single, dp and ddp in 32-true, and single in 16-mixed and bf16-mixed: syncs/*.json
#   -- timed, one at a time:
#   bench_gpt   (200) python -m benchmarks, the gpt workload, 32-true and bf16-mixed, single and dp, against
#                     bare Lightning and the plain PyTorch loop: bench_gpt/results.md
#   mfu         (120) configs/experiment/gpt_gpu.yaml (86M parameters, 1024 tokens, batch 256) in bf16-mixed for
#                     40 steps (at batch 128 if that fails, the part then failed), and in 32-true at batch 64 for
#                     20: tokens/s and perf/mfu, mfu/*.json
#   nvtx        (60)  configs/debug/nsight.yaml's NVTX ranges over 10 steps: under `nsys profile -t cuda,nvtx` where
#                     nsys is on PATH (nvtx/nvtx_sum.txt, by `nsys stats --report nvtx_sum`), else counted from
#                     torch.profiler's events by scripts/nvtx_ranges.py (nvtx/ranges.txt)
#   stall       (120) the stall of an asynchronous checkpoint save of state in GPU memory, by
#                     scripts/checkpoint_stall.py where this copy has it (a line saying it is absent otherwise)
#   bench_image (170) as bench_gpt for the image workload (a run cut by its timeout still writes its report)
# summary.txt lists each part's exit status and seconds; the script's exit status is 1 if any part failed.
# Each part's log is OUTPUT_DIR/<part>.log; the whole console output is OUTPUT_DIR/console.log.
set -uo pipefail
{ # the whole script is read before it runs (an edit during a run changes nothing of it); the `exit` at its end
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-gpu_check}" && cd "${1:-gpu_check}" && pwd)
repo=$PWD
dry=${GPU_CHECK_DRY_RUN:-0}
wheels=$repo/scripts/gpu_wheels
site=${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/gpu_check_site}
runs=${GPU_CHECK_SCRATCH:-${TMPDIR:-/tmp}/gpu_check_runs}
py=${PYTHON:-python3}
summary=$out/summary.txt
: >"$summary"
exec > >(tee -a "$out/console.log") 2>&1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# part NAME SECONDS FUNCTION [ARGS...]: the function (below) in a bash of its own under the timeout, with this
# script's settings; its output in NAME.log, a line in summary.txt
part() {
  local name=$1 limit=$2 start=$SECONDS rc state
  shift 2
  [[ " ${GPU_CHECK_PARTS:-$name} " == *" $name "* ]] || return 0
  [ "$dry" = 1 ] && limit=$((limit * 4)) # a dry run's tiny parts take longer on a shared CPU than real ones on a GPU
  state="$(declare -p py out runs repo dry accel gpus test_workers half user_steps sync_size bench_size mfu_size \
    mfu_batches mfu_steps stall_size nvtx_flags); $(declare -f gpu_tests users syncs bench gpt_gpu mfu nvtx stall)"
  echo "== $name (at most ${limit}s)"
  timeout --kill-after=15 "$limit" bash -c "$state"'; "$@"' "$name" "$@" >"$out/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && echo "(stopped by its timeout of ${limit}s)" >>"$out/$name.log"
  printf '%-12s rc=%-4s %4ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$summary"
  tail -n 4 "$out/$name.log" | sed 's/^/   | /'
}

# -- setup: the wheels the python lacks, and the project ---------------------------------------------------------------
export PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$py" -c '
import importlib.util
needed = {"jsonargparse": "jsonargparse", "docstring_parser": "docstring-parser", "typeshed_client": "typeshed-client",
          "xdist": "pytest-xdist", "execnet": "execnet", "pytest_timeout": "pytest-timeout"}
print(" ".join(wheel for module, wheel in needed.items() if importlib.util.find_spec(module) is None))')
setup_rc=0
if [ -n "$missing" ]; then
  echo "== setup: installing $missing from $wheels into $site"
  # shellcheck disable=SC2086  # $missing is a word list
  timeout "${SETUP_TIMEOUT:-30}" "$py" -m pip install --quiet --no-index --no-deps --find-links "$wheels" \
    --target "$site" $missing || { setup_rc=1 && echo "setup: pip install of $missing failed"; }
fi
if ! "$py" -c 'import importlib.metadata as m; m.distribution("lightning-multigpu")' 2>/dev/null; then
  timeout "${SETUP_TIMEOUT:-30}" "$py" -m pip install --quiet --no-index --no-deps --find-links "$wheels" \
    --target "$site" -e . || { setup_rc=1 && echo "setup: pip install -e . failed"; }
fi
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname), dry run: $dry"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c "
import platform, torch, lightning, torchmetrics, jsonargparse, multigpu
print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'lightning', lightning.__version__, 'torchmetrics', torchmetrics.__version__,
      'jsonargparse', jsonargparse.__version__, 'multigpu', multigpu.__version__)
print('gpus', torch.cuda.device_count(), *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
print('bf16', torch.cuda.is_available() and torch.cuda.is_bf16_supported())"
} 2>&1 | tee "$out/machine.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || setup_rc=1
printf '%-12s rc=%-4s %4ss\n' setup "$setup_rc" "$SECONDS" >>"$summary"

if [ "$dry" = 1 ]; then
  accel=cpu gpus=1 test_workers=0 half=bf16-mixed    # a CPU has no 16-mixed (Lightning refuses it): bf16 twice
  user_steps=2 sync_size=(--quick --warmup 2 --steps 2) bench_size=(--accelerator cpu --quick --steps 2 --warmup 1)
  mfu_size=(--model.init_args.n_layer=1 --model.init_args.n_head=2 --model.init_args.n_embd=32
    --model.init_args.block_size=32 --data.init_args.block_size=32 --data.init_args.corpus_chars=20000
    --trainer.log_every_n_steps=1) mfu_batches=(4 2) mfu_steps=(3 3)
  stall_size=(--accelerator cpu --repeats 1 --steps 2 --threads 1 --n-layer 1 --n-embd 32 --n-head 2 --batch-size 2)
  nvtx_flags=(--stand-in) # the callback believes it trains on CUDA: the ranges are counted, no NVTX call is made
else
  if ! "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "PyTorch sees no CUDA GPU: nothing checked (GPU_CHECK_DRY_RUN=1 runs the plumbing on a CPU)" >>"$summary"
    tail -n 1 "$summary"
    exit 2
  fi
  accel=gpu gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())') test_workers=4 half=16-mixed
  user_steps=30 sync_size=(--warmup 10 --steps 20) bench_size=(--accelerator gpu --steps 30 --warmup 10)
  mfu_size=() mfu_batches=(256 64) mfu_steps=(40 20)
  stall_size=(--accelerator gpu --repeats 1 --steps 10 --threads 8)
  nvtx_flags=()
fi

# -- the correctness parts (run side by side) --------------------------------------------------------------------------
gpu_tests() {
  local files=(tests/workflows/test_gpu.py)
  # the example GPT's fsdp2 / tensor_parallel runs, where the examples are (a generated project may have none)
  [ -e tests/examples/test_gpu_model_parallel.py ] && files+=(tests/examples/test_gpu_model_parallel.py)
  "$py" -m pytest -m gpu -v -p no:cacheprovider -n "$test_workers" --junitxml="$out/gpu_tests.xml" "${files[@]}"
}

users() {
  local rc=0 k=0 name model data precision
  for name in regression gan; do
    case $name in
      regression) model=tests.zoo.regression.Regressor data=(--data=tests.zoo.regression.RegressionData
        --data.init_args.num_workers=2) ;;
      gan) model=tests.zoo.gan.TinyGAN data=(--data=tests.zoo.gan.RingData) ;;
    esac
    for precision in $(printf '%s\n' "$half" bf16-mixed | uniq); do # on a CPU (dry run) both are bf16-mixed
      local run=$runs/users/$((k += 1))-$name-$precision
      echo "-- $name under dp, $precision: $run"
      mkdir -p "$out/users"
      "$py" -m src.cli fit --model="$model" "${data[@]}" --trainer.accelerator="$accel" --trainer.strategy=dp \
        --trainer.devices="$gpus" --trainer.precision="$precision" --trainer.max_steps="$user_steps" \
        --trainer.max_epochs=-1 --trainer.log_every_n_steps=1 --trainer.default_root_dir="$run" --progress_bar=plain &&
        "$py" scripts/last_metrics.py "$run" --out "$out/users/${run##*/}.json" || rc=1
    done
  done
  return $rc
}

syncs() {
  local rc=0 k=0 strategy precision name
  for run in $(printf '%s\n' single:32-true dp:32-true ddp:32-true "single:$half" single:bf16-mixed | uniq); do
    strategy=${run%%:*} precision=${run#*:} name=$((k += 1))-$strategy-$precision
    "$py" scripts/sync_count.py --strategy "$strategy" "${sync_size[@]}" --run-dir "$runs/syncs/$name" \
      --out "$out/syncs/$name.json" -- --trainer.accelerator="$accel" --trainer.precision="$precision" || rc=1
  done
  return $rc
}


# -- the timed parts (run one at a time) -------------------------------------------------------------------------------
bench() {  # bench WORKLOAD: template single and dp against bare Lightning and the plain loop, 32-true and bf16
  local args=(--workload "$1" --strategies single,dp --devices 1 --precisions 32,bf16-mixed --repeats 1
    --startup-repeats 0 "${bench_size[@]}" --out "$out/bench_$1")
  printf '%s\n' "${args[@]}" >"$out/bench_$1.args" # the real rows' options: the dry-run test plans them
  if [ "$dry" = 1 ] && [ "$1" = image ]; then # the same function as the GPT's; the suite trains these rows on a CPU
    echo "dry run: the image rows are planned (bench_image.args), not run (tests/examples/test_bench_workloads.py)"
    return 0
  fi
  [ "$dry" = 1 ] && args+=(--precisions 32 --strategies single)
  "$py" -m benchmarks "${args[@]}"
}

gpt_gpu() { # gpt_gpu PRECISION BATCH STEPS: the GPU preset, without validation; its last metrics in RUN.json
  local run=$runs/mfu/gpt_gpu-$1-b$2
  mkdir -p "$out/mfu"
  echo "-- gpt_gpu, $1, batch $2, $3 steps: $run"
  "$py" -m src.cli fit --config configs/experiment/gpt_gpu.yaml "${mfu_size[@]}" --trainer.accelerator="$accel" \
    --trainer.devices=1 --trainer.precision="$1" --data.init_args.batch_size="$2" --trainer.max_steps="$3" \
    --trainer.limit_val_batches=0 --trainer.num_sanity_val_steps=0 --trainer.default_root_dir="$run" \
    --progress_bar=plain && "$py" scripts/last_metrics.py "$run" --out "$out/mfu/${run##*/}.json"
}

mfu() { # bf16-mixed at the preset's batch (half of it if that fails, e.g. out of memory), then 32-true
  local rc=0
  gpt_gpu bf16-mixed "${mfu_batches[0]}" "${mfu_steps[0]}" ||
    { rc=1 && gpt_gpu bf16-mixed "$((mfu_batches[0] / 2))" "${mfu_steps[0]}"; }
  gpt_gpu 32-true "${mfu_batches[1]}" "${mfu_steps[1]}" || rc=1
  return $rc
}

nvtx() { # the Nsight preset's ranges: under nsys where it is installed, else counted by scripts/nvtx_ranges.py
  local run=$runs/nvtx
  local fit=(--trainer.accelerator="$accel" --trainer.devices=1 --trainer.limit_train_batches=10
    --trainer.limit_val_batches=2 --trainer.default_root_dir="$run")
  mkdir -p "$out/nvtx" "$run"
  if [ "$dry" != 1 ] && command -v nsys >/dev/null; then
    nsys profile -t cuda,nvtx --force-overwrite=true -o "$run/nsight" "$py" -m src.cli fit \
      --config configs/debug/nsight.yaml "${fit[@]}" --progress_bar=none &&
      nsys stats --report nvtx_sum "$run/nsight.nsys-rep" | tee "$out/nvtx/nvtx_sum.txt"
  else
    "$py" scripts/nvtx_ranges.py --out "$out/nvtx/ranges.txt" "${nvtx_flags[@]}" -- "${fit[@]}"
  fi
}

stall() {
  if [ ! -e scripts/checkpoint_stall.py ]; then
    echo "skipped: scripts/checkpoint_stall.py is not in this copy (asynchronous checkpoints have not landed)"
    return 0
  fi
  "$py" scripts/checkpoint_stall.py "${stall_size[@]}" ${STALL_ARGS:-}
}

# -- the run -----------------------------------------------------------------------------------------------------------
part gpu_tests "${GPU_TESTS_TIMEOUT:-150}" gpu_tests &
side=($!)
part users "${USERS_TIMEOUT:-150}" users &
side+=($!)
part syncs "${SYNCS_TIMEOUT:-150}" syncs &
side+=($!)
wait "${side[@]}" # by their ids: a bare `wait` would also wait for the console's tee, which never ends
part bench_gpt "${BENCH_GPT_TIMEOUT:-200}" bench gpt
part mfu "${MFU_TIMEOUT:-120}" mfu
part nvtx "${NVTX_TIMEOUT:-60}" nvtx
part stall "${STALL_TIMEOUT:-120}" stall
part bench_image "${BENCH_IMAGE_TIMEOUT:-170}" bench image

echo "== summary ($SECONDS s in all; outputs in $out, and all of them in $out/outputs.tgz)"
cat "$summary"
# written beside the runs, then moved in; console.log grows while it is read (tar's status 1: kept as it was)
mkdir -p "$runs" && tar czf "$runs/outputs.tgz" --warning=no-file-changed --exclude=./outputs.tgz -C "$out" .
[ $? -le 1 ] && mv "$runs/outputs.tgz" "$out/outputs.tgz"
! grep -v ' rc=0 ' "$summary" | grep -q .
exit
}

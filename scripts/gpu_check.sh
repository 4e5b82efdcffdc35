#!/usr/bin/env bash
# GPU check, for a machine with at least one CUDA GPU (about 10 minutes on one GPU):
#   1. the GPU tests (tests/workflows/test_gpu.py): dp with real replicas (two on one GPU when there is only one),
#      the autocast dtype inside the replicas for 16-mixed and bf16-mixed, manual optimization under dp,
#      and every GPU preset (gpu, dp, ddp, ddp_spawn) and precision preset; fsdp2 and tensor_parallel on the GPT
#      in bf16-mixed and bf16-true (tests/examples/test_gpu_model_parallel.py, NCCL, sharded checkpoints);
#   2. a throughput line per strategy and precision: the image workload under single, dp, ddp, ddp_spawn and a
#      plain PyTorch loop, in 32, bf16-mixed and 16-mixed (python -m benchmarks; BENCH_ARGS replaces the selection).
# Usage: bash scripts/gpu_check.sh [OUTPUT_DIR]      (default: gpu_check/)
# Each part runs even if an earlier one fails; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
status=0

{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
} 2>&1 | tee "$out/machine.txt"

echo "== GPU tests"
gpu_tests=(tests/workflows/test_gpu.py)
# the example GPT's fsdp2 / tensor_parallel runs, where the examples are (a generated project may have none)
[ -e tests/examples/test_gpu_model_parallel.py ] && gpu_tests+=(tests/examples/test_gpu_model_parallel.py)
timeout "${TEST_TIMEOUT:-420}" python -m pytest -m gpu -v -p no:cacheprovider -s "${gpu_tests[@]}" 2>&1 | tee "$out/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== throughput per strategy and precision"
bench_args=${BENCH_ARGS:---workload image --strategies single,dp,ddp,ddp_spawn --precisions 32,bf16-mixed,16-mixed --repeats 1 --steps 50 --warmup 10}
# shellcheck disable=SC2086  # bench_args is a word list
timeout "${BENCH_TIMEOUT:-360}" python -m benchmarks --accelerator gpu $bench_args --out "$out/bench" 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

exit $status

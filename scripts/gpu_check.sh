#!/usr/bin/env bash
# GPU check, for a machine with at least one CUDA GPU (about 6 minutes on one GPU):
#   1. the GPU tests (tests/test_gpu.py): dp with real replicas (two on one GPU when there is only one),
#      the autocast dtype inside the replicas for 16-mixed and bf16-mixed, manual optimization under dp,
#      and every GPU preset (gpu, dp, ddp, ddp_spawn) in 32 / 16-mixed / bf16-mixed;
#   2. a throughput line per strategy and precision (python -m src.bench on the GPU).
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
timeout "${TEST_TIMEOUT:-300}" python -m pytest -m gpu -v -p no:cacheprovider -s tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== throughput per strategy and precision"
timeout "${BENCH_TIMEOUT:-300}" python -m src.bench --accelerator gpu ${BENCH_ARGS:-} --out "$out/bench" 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

exit $status

#!/usr/bin/env bash
# PERF.md's GPU workloads through ccgraph (bench_gpu) and through PyTorch (torch_reference.py) in one
# run on one machine, both on every visible GPU (CUDA_VISIBLE_DEVICES picks fewer), merged into one
# markdown table (compare_table.py). bench_gpu's output also has the cost model's predictions
# beside the measured times (`MODEL` lines and their table).
#
# Usage: bash bench/compare_gpu.sh BUILD_DIR [OUTDIR]
#   BUILD_DIR  a CUDA build of ccgraph (runs BUILD_DIR/bench/bench_gpu)
#   OUTDIR     where ccgraph.txt, torch.txt and table.md go (default BUILD_DIR/compare-DATE)
# Environment: BENCH_GPU_ARGS (e.g. --quick) and TORCH_REF_ARGS (e.g. --quick) pass extra arguments;
# TORCH_REF_TIMEOUT (seconds, default 900) bounds the PyTorch run.
# Exits non-zero only if bench_gpu fails (a missing torch or a failed PyTorch run is reported and
# the table is made from what there is).
set -u -o pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash $0 BUILD_DIR [OUTDIR]" >&2
  exit 2
fi
BUILD_DIR=$1
OUTDIR=${2:-$BUILD_DIR/compare-$(date +%Y%m%d-%H%M%S)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUTDIR" || exit 2

# NVLink multicast off for NCCL, in both programs (PERF.md's method).
export NCCL_NVLS_ENABLE=0

{
  echo "# compare_gpu.sh $(date -Iseconds 2>/dev/null || date)"
  echo "# host $(hostname 2>/dev/null), NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>&1 | sed 's/^/# /'
  else
    echo "# nvidia-smi not found"
  fi
} | tee "$OUTDIR/env.txt"

echo
echo "== ccgraph: $BUILD_DIR/bench/bench_gpu ${BENCH_GPU_ARGS:-}"
bench_rc=0
if [ -x "$BUILD_DIR/bench/bench_gpu" ]; then
  # shellcheck disable=SC2086  # BENCH_GPU_ARGS is a word list on purpose
  "$BUILD_DIR/bench/bench_gpu" ${BENCH_GPU_ARGS:-} 2>&1 | tee "$OUTDIR/ccgraph.txt"
  bench_rc=${PIPESTATUS[0]}
  [ "$bench_rc" -eq 0 ] || echo "# error: bench_gpu exited with status $bench_rc" | tee -a "$OUTDIR/ccgraph.txt"
else
  echo "# error: $BUILD_DIR/bench/bench_gpu not found or not executable (a CUDA build?)" | tee "$OUTDIR/ccgraph.txt"
  bench_rc=1
fi

echo
echo "== PyTorch: python3 $HERE/torch_reference.py ${TORCH_REF_ARGS:-}"
if python3 -c "import torch" >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  timeout -k 30 "${TORCH_REF_TIMEOUT:-900}" python3 "$HERE/torch_reference.py" ${TORCH_REF_ARGS:-} 2>&1 | tee "$OUTDIR/torch.txt"
  torch_rc=${PIPESTATUS[0]}
  [ "$torch_rc" -eq 0 ] || echo "# error: torch_reference.py exited with status $torch_rc" | tee -a "$OUTDIR/torch.txt"
else
  echo "# error: python3 cannot import torch; no PyTorch reference numbers" | tee "$OUTDIR/torch.txt"
fi

echo
echo "== table: $OUTDIR/table.md"
python3 "$HERE/compare_table.py" "$OUTDIR/env.txt" "$OUTDIR/ccgraph.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"

exit "$bench_rc"

#!/usr/bin/env bash
# The index / GEMM / attention kernels through ccgraph (bench_gpu_index) and through PyTorch
# (torch_index.py) in one run on one GPU, merged into one markdown table (compare_table.py: the
# `ccgraph / torch` column is the time ratio, < 1 means ccgraph is faster).
#
# Usage: bash bench/compare_index.sh BUILD_DIR [OUTDIR]
#   BUILD_DIR  a CUDA build of ccgraph (runs BUILD_DIR/bench/bench_gpu_index)
#   OUTDIR     where ccgraph.txt, torch.txt and table.md go (default BUILD_DIR/compare-index-DATE)
# Environment: BENCH_ARGS (e.g. --quick, --only sdpa) is passed to both programs.
set -u -o pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash $0 BUILD_DIR [OUTDIR]" >&2
  exit 2
fi
BUILD_DIR=$1
OUTDIR=${2:-$BUILD_DIR/compare-index-$(date +%Y%m%d-%H%M%S)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUTDIR" || exit 2

{
  echo "# compare_index.sh $(date -Iseconds 2>/dev/null || date)"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1 | sed 's/^/# /'; fi
} | tee "$OUTDIR/env.txt"

echo "== ccgraph: $BUILD_DIR/bench/bench_gpu_index ${BENCH_ARGS:-}"
# shellcheck disable=SC2086  # BENCH_ARGS is a word list on purpose
"$BUILD_DIR/bench/bench_gpu_index" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/ccgraph.txt"
bench_rc=${PIPESTATUS[0]}

echo "== PyTorch: python3 $HERE/torch_index.py ${BENCH_ARGS:-}"
if python3 -c "import torch" >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  timeout -k 30 900 python3 "$HERE/torch_index.py" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/torch.txt"
else
  echo "# error: python3 cannot import torch; no PyTorch reference numbers" | tee "$OUTDIR/torch.txt"
fi

echo "== table: $OUTDIR/table.md"
python3 "$HERE/compare_table.py" "$OUTDIR/env.txt" "$OUTDIR/ccgraph.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"
exit "$bench_rc"

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
# TORCH_REF_TIMEOUT (seconds, default 900) bounds each PyTorch run; COMPARE_STEPS=0 skips the
# training step and GPT block pairs (bench_gpu_train, bench_gpu_block and their PyTorch scripts,
# run when built), COMPARE_WORLD sets their GPU count (default: every visible GPU, at most 2).
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

# The open issues' whole-program workloads, where they are built: the data-parallel training
# step (bench_gpu_train, against DDP) and the GPT block with TP + SP and with FSDP
# (bench_gpu_block, against parallelize_module / FSDP2), each beside its PyTorch script, on
# COMPARE_WORLD GPUs (default: every visible one, at most 2: the workloads' PERF.md size).
steps=()
if [ "${COMPARE_STEPS:-1}" != 0 ]; then
  world=${COMPARE_WORLD:-$(python3 -c "import torch; print(min(2, torch.cuda.device_count()))" 2>/dev/null || echo 2)}
  run_pair() {  # run_pair NAME BINARY SCRIPT ARGS...: both sides, their outputs in NAME_*.txt
    local name=$1 bin=$2 script=$3
    shift 3
    if [ ! -x "$BUILD_DIR/bench/$bin" ]; then
      echo "# $BUILD_DIR/bench/$bin not built: no $name rows" | tee "$OUTDIR/${name}_ccgraph.txt"
      steps+=("$OUTDIR/${name}_ccgraph.txt")
      return
    fi
    echo
    echo "== $name: $bin $* --world $world, then $script $* --world $world"
    local rc
    "$BUILD_DIR/bench/$bin" "$@" --world "$world" 2>&1 | tee "$OUTDIR/${name}_ccgraph.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || echo "# error: $bin $* exited with status $rc" | tee -a "$OUTDIR/${name}_ccgraph.txt"
    timeout -k 30 "${TORCH_REF_TIMEOUT:-900}" python3 "$HERE/$script" "$@" --world "$world" 2>&1 | tee "$OUTDIR/${name}_torch.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || echo "# error: $script $* exited with status $rc" | tee -a "$OUTDIR/${name}_torch.txt"
    steps+=("$OUTDIR/${name}_ccgraph.txt" "$OUTDIR/${name}_torch.txt")
  }
  if python3 -c "import torch" >/dev/null 2>&1; then
    run_pair train bench_gpu_train torch_train_reference.py
    run_pair block bench_gpu_block torch_block_reference.py
    run_pair block_fsdp bench_gpu_block torch_block_reference.py --fsdp
  else
    echo "# error: python3 cannot import torch; no training step or block rows" | tee "$OUTDIR/steps.txt"
    steps+=("$OUTDIR/steps.txt")
  fi
fi

echo
echo "== table: $OUTDIR/table.md"
python3 "$HERE/compare_table.py" "$OUTDIR/env.txt" "$OUTDIR/ccgraph.txt" "$OUTDIR/torch.txt" "${steps[@]}" | tee "$OUTDIR/table.md"

exit "$bench_rc"

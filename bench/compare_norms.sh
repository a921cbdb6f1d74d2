#!/usr/bin/env bash
# The row-wise kernels and reductions through ccgraph (bench_gpu_norms) and through PyTorch
# (torch_norms.py) in one run on one GPU, merged into one markdown table (compare_table.py), then
# issue 14's check: softmax / log_softmax / layer_norm / rms_norm (forward) within 1.25x of
# PyTorch's time.
#
# Usage: bash bench/compare_norms.sh BUILD_DIR [OUTDIR]
#   BUILD_DIR  a CUDA build of ccgraph (runs BUILD_DIR/bench/bench_gpu_norms)
#   OUTDIR     where ccgraph.txt, torch.txt and table.md go (default BUILD_DIR/compare-norms-DATE)
# Environment: BENCH_ARGS (e.g. --quick, --only softmax) is passed to both programs.
# Exits non-zero if bench_gpu_norms fails; a missing torch is reported and the table is made from
# what there is.
set -u -o pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash $0 BUILD_DIR [OUTDIR]" >&2
  exit 2
fi
BUILD_DIR=$1
OUTDIR=${2:-$BUILD_DIR/compare-norms-$(date +%Y%m%d-%H%M%S)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUTDIR" || exit 2

{
  echo "# compare_norms.sh $(date -Iseconds 2>/dev/null || date)"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1 | sed 's/^/# /'; fi
} | tee "$OUTDIR/env.txt"

echo
echo "== ccgraph: $BUILD_DIR/bench/bench_gpu_norms ${BENCH_ARGS:-}"
rc=0
if [ -x "$BUILD_DIR/bench/bench_gpu_norms" ]; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a word list on purpose
  "$BUILD_DIR/bench/bench_gpu_norms" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/ccgraph.txt"
  rc=${PIPESTATUS[0]}
else
  echo "# error: $BUILD_DIR/bench/bench_gpu_norms not found (a CUDA build?)" | tee "$OUTDIR/ccgraph.txt"
  rc=1
fi

echo
echo "== PyTorch: python3 $HERE/torch_norms.py ${BENCH_ARGS:-}"
if python3 -c "import torch" >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  timeout -k 30 900 python3 "$HERE/torch_norms.py" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/torch.txt"
else
  echo "# error: python3 cannot import torch; no PyTorch numbers" | tee "$OUTDIR/torch.txt"
fi

echo
echo "== table: $OUTDIR/table.md"
python3 "$HERE/compare_table.py" "$OUTDIR/env.txt" "$OUTDIR/ccgraph.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"

echo
echo "== issue 14: softmax / layer_norm / rms_norm forward within 1.25x of PyTorch"
python3 - "$OUTDIR/ccgraph.txt" "$OUTDIR/torch.txt" <<'EOF' | tee -a "$OUTDIR/table.md"
import re, sys
vals = {}
for path in sys.argv[1:]:
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"^RESULT\s+(\S+)\s+(\S+)\s+(\S+)\s+us\s*$", line)
        if m:
            vals[(m.group(1), m.group(2))] = float(m.group(3))
met = missed = 0
for (w, impl), us in sorted(vals.items()):
    if impl != "ccgraph_kernel" or not re.match(r"^(log_)?softmax_(f32|bf16)|^(layer|rms)_norm_(f32|bf16)", w):
        continue
    t = vals.get((w, "torch_eager"))
    if t is None or t != t or us != us:
        print(f"- {w}: no PyTorch number")
        continue
    ok = us <= 1.25 * t
    met += ok
    missed += not ok
    print(f"- {w}: {us:.1f} us vs torch {t:.1f} us = {us / t:.3f}x: {'met' if ok else 'MISSED'}")
print(f"{met} met, {missed} missed")
EOF

exit "$rc"

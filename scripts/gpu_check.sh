#!/usr/bin/env bash
# Everything ccgraph can check on a GPU machine, in one go, for lent machines whose time is
# short: the GPU test cases one by one (each under its own time limit, so a case that hangs
# costs its limit and the others still run), the launcher test on up to 2 processes, example 04,
# and bench_gpu. Logs go to OUTDIR; OUTDIR/summary.txt has one line per step.
#
# Usage: bash scripts/gpu_check.sh BUILD_DIR OUTDIR
#   BUILD_DIR  a CUDA build of ccgraph (its binaries may have been built on another machine and
#              copied: nothing is built here)
# Environment:
#   GPU_CHECK_CASE_TIMEOUT   seconds per test case (default 60)
#   GPU_CHECK_CASES          a doctest filter for the cases (default: all that a GPU count runs)
#   GPU_CHECK_BENCH          0 skips bench_gpu; otherwise its arguments (default --quick)
#   GPU_CHECK_BENCH_TIMEOUT  seconds for bench_gpu (default 300)
# Exits non-zero when any step failed.
set -u -o pipefail

if [ $# -ne 2 ]; then
  echo "usage: bash $0 BUILD_DIR OUTDIR" >&2
  exit 2
fi
BUILD=$1
OUT=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT" || exit 2
# NVLink multicast stays off: on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0
case_timeout=${GPU_CHECK_CASE_TIMEOUT:-60}
summary="$OUT/summary.txt"
: >"$summary"
failed=0

# step NAME STATUS SECONDS [DETAIL]: one summary line, echoed.
step() {
  printf '%-64s %-8s %5ss %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$summary"
  [ "$2" = ok ] || failed=1
}

# run_step NAME LIMIT LOG CMD...: runs CMD under `timeout`, records ok / failed / TIMEOUT.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    step "$name" ok $((SECONDS - t0))
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    step "$name" TIMEOUT $((SECONDS - t0)) "killed after ${limit}s: see $log"
  else
    step "$name" failed $((SECONDS - t0)) "exit $rc: see $log"
  fi
}

{
  echo "# gpu_check.sh $(date -u -Iseconds 2>/dev/null || date), build $BUILD"
  nvidia-smi -L 2>&1 || echo "nvidia-smi not found"
  nvidia-smi topo -m 2>&1 | sed -n '1,3p'
  for b in tests/ccgraph_gpu_tests bench/bench_gpu; do
    [ -x "$BUILD/$b" ] && ldd "$BUILD/$b" 2>&1 | grep -E "nccl|cublas|cudart|not found" | sed "s|^|$b: |"
  done
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

tests="$BUILD/tests/ccgraph_gpu_tests"
if [ -x "$tests" ]; then
  # The cases this machine runs: doctest lists those its skip decorators (GPU counts) keep.
  mapfile -t cases < <("$tests" --list-test-cases --no-version ${GPU_CHECK_CASES:+"-tc=$GPU_CHECK_CASES"} 2>/dev/null |
    grep -v -e '^\[doctest\]' -e '^====')
  mkdir -p "$OUT/cases"
  for c in "${cases[@]}"; do
    [ -n "$c" ] || continue
    # doctest filters treat , as a separator and * ? as wildcards: those match themselves here.
    run_step "case $c" "$case_timeout" "$OUT/cases/$c.log" "$tests" "-tc=$c" --duration=true
  done
else
  step "ccgraph_gpu_tests" failed 0 "$tests not found"
fi

launch="$BUILD/tests/ccgraph_gpu_launch"
if [ -x "$launch" ] && [ "$gpus" -ge 1 ]; then
  n=$((gpus < 2 ? gpus : 2))
  run_step "launcher: $n process(es), init_from_env" 120 "$OUT/launch.log" \
    bash "$HERE/ccgraph-launch" -n "$n" "$launch"
fi

example="$BUILD/examples/example_04_gpu_overlap"
[ -x "$example" ] && run_step "example 04" 300 "$OUT/example_04.log" "$example"

bench="$BUILD/bench/bench_gpu"
if [ "${GPU_CHECK_BENCH:---quick}" != 0 ] && [ -x "$bench" ]; then
  # shellcheck disable=SC2086  # the arguments are a word list on purpose
  run_step "bench_gpu ${GPU_CHECK_BENCH:---quick}" "${GPU_CHECK_BENCH_TIMEOUT:-300}" \
    "$OUT/bench_gpu.txt" "$bench" ${GPU_CHECK_BENCH:---quick}
fi

echo
echo "== summary ($OUT/summary.txt)"
cat "$summary"
exit $failed

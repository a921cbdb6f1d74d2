#!/usr/bin/env bash
# Everything ccgraph can check on a GPU machine, in one go, for lent machines whose time is
# short: the GPU test cases one by one (each under its own time limit, so a case that hangs
# costs its limit and the others still run), the launcher test on 1, 2 and every GPU's worth
# of processes, the NVTX cases under the NVTX recorder, the GPU examples, and bench_gpu. Logs
# go to OUTDIR; OUTDIR/summary.txt has one line per step.
#
# The cases that one GPU runs (the kernels, one-rank collectives) run first, GPU_CHECK_JOBS at
# a time, each process seeing one GPU (CUDA_VISIBLE_DEVICES, in turns): what they check does not
# depend on the GPU count. The cases that need more GPUs run after them with every GPU visible:
# all in one process first, then each one that did not pass there alone.
#
# Usage: bash scripts/gpu_check.sh BUILD_DIR OUTDIR
#   BUILD_DIR  a CUDA build of ccgraph (its binaries may have been built on another machine and
#              copied: nothing is built here). The NVTX cases (nvtx.*) run in a step of their
#              own, with NVTX_INJECTION64_PATH set to BUILD_DIR/tests/libccgraph_nvtx_recorder.so
#              (as CTest's gpu.nvtx_ranges does), not among the other cases (they skip there).
# Environment:
#   GPU_CHECK_CASE_TIMEOUT   seconds per test case (default 60)
#   GPU_CHECK_CASES          a doctest filter for the cases (default: all that a GPU count runs)
#   GPU_CHECK_JOBS           one-GPU cases run at once (default: the number of GPUs)
#   GPU_CHECK_TOGETHER       0: every multi-GPU case alone, without the run of all in one process
#   GPU_CHECK_TOGETHER_TIMEOUT  seconds for that run (default: the case limit + 10 per case)
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
# The NVTX cases need the recorder as NVTX's tool: they run in their own step, below.
nvtx_cases="nvtx.*"
# list_cases [VISIBLE]: the cases doctest keeps (its skip decorators read the GPU count), one a
# line; with VISIBLE, as a process that sees only those GPUs.
list_cases() {
  env ${1:+CUDA_VISIBLE_DEVICES=$1} "$tests" --list-test-cases --no-version ${GPU_CHECK_CASES:+"-tc=$GPU_CHECK_CASES"} \
    "-tce=$nvtx_cases" 2>/dev/null | grep -v -e '^\[doctest\]' -e '^====' | grep -v '^$'
}
if [ -x "$tests" ]; then
  mkdir -p "$OUT/cases"
  mapfile -t all_cases < <(list_cases)
  one_gpu_cases=()
  [ "$gpus" -ge 1 ] && mapfile -t one_gpu_cases < <(list_cases 0)
  # The rest: cases that only more GPUs run (doctest lists in the same order both times).
  declare -A on_one=()
  for c in "${one_gpu_cases[@]}"; do on_one[$c]=1; done
  jobs=${GPU_CHECK_JOBS:-$gpus}
  [ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
  # One-GPU cases, `jobs` at a time, GPU i % gpus for the i-th. Each writes its summary line
  # itself (one short append: lines of parallel cases do not mix) and returns non-zero when it
  # did not pass (xargs then exits non-zero).
  run_one_gpu_case() {
    local i=$1 c=$2 t0=$SECONDS rc=0 log status=ok detail=""
    log="$OUT/cases/$c.log"
    CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout -k 10 "$case_timeout" "$tests" "-tc=$c" --duration=true >"$log" 2>&1 || rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      status=TIMEOUT detail="killed after ${case_timeout}s: see $log"
    elif [ $rc -ne 0 ]; then
      status=failed detail="exit $rc: see $log"
    fi
    printf '%-64s %-8s %5ss %s\n' "case $c (GPU $((i % gpus)) alone)" "$status" $((SECONDS - t0)) "$detail" | tee -a "$summary"
    [ "$status" = ok ]
  }
  export -f run_one_gpu_case
  export OUT tests case_timeout gpus summary
  if [ "${#one_gpu_cases[@]}" -gt 0 ]; then
    for i in "${!one_gpu_cases[@]}"; do printf '%s\0%s\0' "$i" "${one_gpu_cases[$i]}"; done |
      xargs -0 -n 2 -P "$jobs" bash -c 'run_one_gpu_case "$1" "$2"' _ || failed=1
  fi
  multi=()
  for c in "${all_cases[@]}"; do [ -n "$c" ] && [ -z "${on_one[$c]:-}" ] && multi+=("$c"); done
  # The multi-GPU cases first all in one process (NCCL's set-up, seconds a process, is then paid
  # once: 16 4-GPU cases took 44 s together and 4-10 s each alone): a case that finished there
  # without an error is recorded from that run. The others (failed, or never reached because the
  # process failed or hung) then run alone, each under its own limit and with its own log.
  declare -A passed_together=() failed_together=()
  together="$OUT/cases/multi_gpu_cases_together.log"
  if [ "${GPU_CHECK_TOGETHER:-1}" != 0 ] && [ "${#multi[@]}" -gt 1 ] && ! printf '%s\n' "${multi[@]}" | grep -q ','; then
    limit=${GPU_CHECK_TOGETHER_TIMEOUT:-$((case_timeout + 10 * ${#multi[@]}))}
    t0=$SECONDS
    timeout -k 10 "$limit" "$tests" "-tc=$(IFS=,; echo "${multi[*]}")" --duration=true >"$together" 2>&1
    echo "# ${#multi[@]} multi-GPU cases in one process: exit $?, $((SECONDS - t0)) s ($together)" | tee -a "$OUT/env.txt"
    # doctest --duration=true: "TEST CASE:  <name>" opens a case, "<seconds> s: <name>" ends it;
    # an "ERROR:" line between them is a failed check or an exception.
    while IFS=$'\t' read -r how c secs; do
      if [ "$how" = ok ]; then
        passed_together[$c]=1
        step "case $c (with the others)" ok "$secs" "see $together"
      else
        failed_together[$c]=1
      fi
    done < <(awk '/^TEST CASE:  /{c=substr($0,13)} /ERROR: /{bad[c]=1}
                  /^[0-9.]+ s: /{n=$0; sub(/^[0-9.]+ s: /,"",n); t[n]=int($1+0.5)}
                  END{for (n in t) print ((n in bad) ? "failed" : "ok") "\t" n "\t" t[n]}' "$together")
  fi
  for c in "${multi[@]}"; do
    [ -n "${passed_together[$c]:-}" ] && continue
    # A case that fails only beside the others is still a failure (state left by another case).
    [ -n "${failed_together[$c]:-}" ] && step "case $c (with the others)" failed 0 "see $together"
    # doctest filters treat , as a separator and * ? as wildcards: those match themselves here.
    run_step "case $c" "$case_timeout" "$OUT/cases/$c.log" "$tests" "-tc=$c" --duration=true
  done
else
  step "ccgraph_gpu_tests" failed 0 "$tests not found"
fi

launch="$BUILD/tests/ccgraph_gpu_launch"
if [ -x "$launch" ] && [ "$gpus" -ge 1 ]; then
  # 1, 2 and every GPU's worth of processes (each once).
  for n in $(printf '%s\n' 1 2 "$gpus" | awk -v g="$gpus" '$1 <= g' | sort -n -u); do
    run_step "launcher: $n process(es), init_from_env" 120 "$OUT/launch_$n.log" \
      bash "$HERE/ccgraph-launch" -n "$n" "$launch"
  done
fi

# NVTX ranges as a tool sees them: the nvtx.* cases with NVTX's tool set to the recorder (an
# absolute path: the cases find the library NVTX loaded by the same name).
recorder="$BUILD/tests/libccgraph_nvtx_recorder.so"
if [ -x "$tests" ] && [ "$gpus" -ge 1 ]; then
  if [ -f "$recorder" ]; then
    recorder="$(cd "$(dirname "$recorder")" && pwd)/$(basename "$recorder")"
    run_step "NVTX cases ($nvtx_cases) under the NVTX recorder" 120 "$OUT/cases/nvtx.log" \
      env NVTX_INJECTION64_PATH="$recorder" "$tests" "-tc=$nvtx_cases" --duration=true
  else
    step "NVTX cases ($nvtx_cases) under the NVTX recorder" failed 0 "$recorder not found"
  fi
fi

for example in "$BUILD"/examples/example_*gpu*; do
  [ -x "$example" ] || continue
  run_step "$(basename "$example")" 300 "$OUT/$(basename "$example").log" "$example"
done

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

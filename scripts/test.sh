#!/usr/bin/env bash
# Builds ccgraph in build/ (Release) and runs every test: the structure and compile-fail tests,
# the examples, and the GPU tests when a GPU is present; then the packaging
# tests: the consumer projects (scripts/consumers.sh: find_package, add_subdirectory,
# pkg-config) unless CCGRAPH_SKIP_CONSUMERS=1, and Conan (scripts/conan.sh) unless
# CCGRAPH_SKIP_CONAN=1; the API reference (`docs`) where Doxygen is installed, unless
# CCGRAPH_SKIP_DOCS=1; then the ASan/UBSan build, which builds and runs the unit tests
# (ccgraph_tests), and the TSan build (scripts/sanitize.sh). With CCGRAPH_SKIP_SANITIZERS=1 the
# release build runs the unit tests instead.
# Also checks the compile time of the umbrella header and the README program against loose
# bounds (bench/compile_time.sh --check). Exits non-zero on any failure. CCGRAPH_JOBS sets the
# build's parallelism.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

ensure_deps

CCGRAPH_SUMMARY_FILE=$(mktemp)
export CCGRAPH_SUMMARY_FILE
trap 'rm -f "$CCGRAPH_SUMMARY_FILE"' EXIT
start=$SECONDS
status=0

# -O2 rather than Release's -O3: the same optimised code paths, for ~15% less compile time
# (measured on the 2-core CI machine; the build is most of a CI run).
# The unit tests (ccgraph_tests) are built once, in the ASan/UBSan build (scripts/sanitize.sh),
# which runs them all; here only when the sanitizers are skipped.
unit_tests=OFF
[[ ${CCGRAPH_SKIP_SANITIZERS:-0} == 1 ]] && unit_tests=ON
# Without a GPU, the CUDA units need only to compile and link: PTX for the virtual Hopper
# architecture (no SASS: ptxas is a fifth of their time, and a driver would JIT the PTX) and
# host code at -O0 (half their time is g++ on the host side). With a GPU they are built to run.
if have_gpu; then
  cuda_args=(-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS_RELEASE="-O2 -DNDEBUG")
else
  cuda_args=(-DCMAKE_CUDA_ARCHITECTURES=90-virtual -DCMAKE_CUDA_FLAGS_RELEASE="-O0 -DNDEBUG")
fi
if ccgraph_configure build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
     "${cuda_args[@]}" -DCCGRAPH_BUILD_UNIT_TESTS=$unit_tests && ccgraph_build build; then
  ccgraph_ctest release build || status=1
else
  record_result release 1 1 build-failed
  status=1
fi

# packaging_stage NAME SKIP_VARIABLE SCRIPT: runs a packaging test script unless SKIP_VARIABLE
# is 1; the script records its own summary line, and a script that dies before it gets one.
packaging_stage() {
  local name=$1 skip=$2 script=$3
  if [[ ${!skip:-0} == 1 ]]; then
    log "$name tests skipped ($skip=1)"
    return 0
  fi
  local rc=0
  bash "$CCGRAPH_ROOT/scripts/$script" || rc=$?
  if ((rc != 0)) && ! grep -q "^$name " "$CCGRAPH_SUMMARY_FILE"; then
    record_result "$name" 1 1 "died:rc=$rc"
  fi
  return "$rc"
}
release_status=$status  # the sanitizer builds run only when the release tests passed

# Compile time is part of the API: the umbrella header and the README program against loose
# bounds (bench/compile_time.sh; the targets and measurements are in bench/RESULTS.md).
log "compile time (bench/compile_time.sh --check)"
if bash "$CCGRAPH_ROOT/bench/compile_time.sh" --check; then
  record_result compile 1 0 ok
else
  record_result compile 1 1 over-bound
  status=1
fi

# The API reference (`docs` target), where Doxygen is installed: optional, nothing installs it.
if [[ ${CCGRAPH_SKIP_DOCS:-0} != 1 && -f build/CMakeCache.txt ]] && command -v doxygen >/dev/null 2>&1; then
  if ccgraph_build build docs; then
    record_result docs 1 0 ok
  else
    record_result docs 1 1 failed
    status=1
  fi
fi
packaging_stage consumers CCGRAPH_SKIP_CONSUMERS consumers.sh || status=1
packaging_stage conan CCGRAPH_SKIP_CONAN conan.sh || status=1

if [[ $release_status -eq 0 && ${CCGRAPH_SKIP_SANITIZERS:-0} != 1 ]]; then
  bash "$CCGRAPH_ROOT/scripts/sanitize.sh" || status=1
elif [[ ${CCGRAPH_SKIP_SANITIZERS:-0} == 1 ]]; then
  log "sanitizer builds skipped (CCGRAPH_SKIP_SANITIZERS=1)"
fi

log "summary ($((SECONDS - start)) s$(have_gpu || echo ', no GPU: tests labelled gpu excluded'))"
passed_all=0
failed_all=0
while read -r name total failed result; do
  printf '  %-10s %4d tests, %3d failed   %s\n' "$name" "$total" "$failed" "$result"
  passed_all=$((passed_all + total - failed))
  failed_all=$((failed_all + failed))
done <"$CCGRAPH_SUMMARY_FILE"
[[ $status -eq 0 ]] && echo "  result: OK" || echo "  result: FAILED"
echo "ccgraph: $passed_all passed, $failed_all failed"
exit "$status"

#!/usr/bin/env bash
# Builds ccgraph in build/ (Release) and runs every test: the CPU tests, the structure and
# compile-fail tests, the examples, and the GPU tests when a GPU is present; then the ASan/UBSan
# and TSan builds (scripts/sanitize.sh) unless CCGRAPH_SKIP_SANITIZERS=1.
# Exits non-zero on any failure. CCGRAPH_JOBS sets the build's parallelism.
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

if ccgraph_configure build -DCMAKE_BUILD_TYPE=Release && ccgraph_build build; then
  ccgraph_ctest release build || status=1
else
  record_result release 1 1 build-failed
  status=1
fi

if [[ $status -eq 0 && ${CCGRAPH_SKIP_SANITIZERS:-0} != 1 ]]; then
  bash "$CCGRAPH_ROOT/scripts/sanitize.sh" || status=1
elif [[ ${CCGRAPH_SKIP_SANITIZERS:-0} == 1 ]]; then
  log "sanitizer builds skipped (CCGRAPH_SKIP_SANITIZERS=1)"
fi

log "summary ($((SECONDS - start)) s$(have_gpu || echo ', no GPU: tests labelled gpu excluded'))"
passed_all=0
failed_all=0
while read -r name total failed result; do
  printf '  %-8s %4d tests, %3d failed   %s\n' "$name" "$total" "$failed" "$result"
  passed_all=$((passed_all + total - failed))
  failed_all=$((failed_all + failed))
done <"$CCGRAPH_SUMMARY_FILE"
[[ $status -eq 0 ]] && echo "  result: OK" || echo "  result: FAILED"
echo "ccgraph: $passed_all passed, $failed_all failed"
exit "$status"

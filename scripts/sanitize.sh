#!/usr/bin/env bash
# Builds the tests with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)
# and with ThreadSanitizer (build-tsan), and runs them under CTest (never the GPU tests).
# Exits non-zero on any failure.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

ensure_deps

# Without NDEBUG, so assertions stay on. Build time is most of CI's time, so the sanitizer
# builds keep only what finds bugs: line tables for reports (-g1: full debug info of the
# template-heavy tests costs ~25% more), the test suite without the examples (the release
# build runs those), and UBSan's checks of arithmetic, shifts, bounds, casts and control flow
# without those of every pointer use (null, alignment, object-size, pointer-overflow, vptr):
# ASan finds bad accesses already, and these made the test files compile 1.7x slower (vptr
# alone 2x). CMakeLists.txt lists the checks. ASan builds at -O0, in half the time of -O1 with
# the tests no slower (32 s either way on the 2-core VM); TSan at -O1, since at -O0 its tests
# took 84 s instead of 14.
sanitized_build() {  # NAME SANITIZER DIR OPT [TEST_SOURCES_REGEX]
  local name=$1 sanitizer=$2 dir=$3 opt=$4 sources=${5:-}
  if ccgraph_configure "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -g1" -DCCGRAPH_SANITIZE="$sanitizer" \
       -DCCGRAPH_TEST_SOURCES_REGEX="$sources" \
       -DCCGRAPH_BUILD_TESTS=ON -DCCGRAPH_BUILD_EXAMPLES=OFF -DCCGRAPH_BUILD_BENCH=OFF \
       -DCCGRAPH_ENABLE_CUDA=OFF &&
     ccgraph_build "$dir"; then
    return 0
  fi
  record_result "$name" 1 1 build-failed
  return 1
}

status=0

export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
if sanitized_build asan address build-asan -O0; then
  ccgraph_ctest asan build-asan -LE gpu || status=1
else
  status=1
fi

export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$CCGRAPH_ROOT/scripts/tsan.supp}
# TSan looks for data races, so its build keeps the tests where threads share state: the
# threads backend, the stores, collectives and their timeouts, executors and compiled functions,
# agreement, groups. Single-threaded tests (shapes, expressions, the passes on one graph) would
# double its build time and can find nothing it finds; ASan/UBSan runs them all.
tsan_tests='^(core/test_timeout|group/|ops/test_(collectives|p2p)|runtime/|schedule/test_agreement)'
if sanitized_build tsan thread build-tsan -O1 "$tsan_tests"; then
  # The TSan runtime of older compilers (g++ 12) aborts with "unexpected memory mapping" under
  # kernels that randomize mmap with more entropy; without ASLR (setarch -R) it runs.
  CCGRAPH_CTEST_PREFIX=()  # read by ccgraph_ctest (common.sh)
  if ! probe=$(build-tsan/tests/ccgraph_tests --list-test-cases 2>&1) &&
     grep -q 'unexpected memory mapping' <<<"$probe"; then
    if setarch "$(uname -m)" -R true 2>/dev/null; then
      log "TSan needs ASLR off here: running its tests under setarch -R"
      # shellcheck disable=SC2034  # read by ccgraph_ctest
      CCGRAPH_CTEST_PREFIX=(setarch "$(uname -m)" -R)
    else
      warn "TSan cannot map its shadow memory here and setarch -R is not permitted"
    fi
  fi
  ccgraph_ctest tsan build-tsan -LE gpu || status=1
else
  status=1
fi

exit "$status"

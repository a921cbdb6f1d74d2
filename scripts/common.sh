# shellcheck shell=bash
# Shared helpers for scripts/*.sh: logging, dependency installation, configure/build, ctest.
# Source it; it sets CCGRAPH_ROOT to the repository root.

CCGRAPH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# ccache hits across clones and build directories (paths relative to the repo root).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$CCGRAPH_ROOT}"
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCGRAPH_ROOT

# Each step says when it started, in seconds since the first script began (sub-scripts share
# the clock): where CI's time goes.
export CCGRAPH_T0=${CCGRAPH_T0:-$(date +%s)}
log() { printf '\n==> [%4d s] %s\n' "$(($(date +%s) - CCGRAPH_T0))" "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

nproc_or_2() { nproc 2>/dev/null || echo 2; }

# True when a GPU is visible (nvidia-smi lists one); GPU-labelled tests run only then.
have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# apt_install PACKAGES...: installs Debian/Ubuntu packages with apt-get (through sudo when not
# root); returns non-zero when that is not possible.
apt_install() {
  log "installing missing packages: $*"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else sudo=(false); fi
  fi
  command -v apt-get >/dev/null 2>&1 &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# Installs (on Debian/Ubuntu, via apt-get) whatever the build needs and is missing. Each
# package is detected by a file or command, so a ready machine installs nothing.
ensure_deps() {
  local missing=()
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  if ! command -v ninja >/dev/null 2>&1 && ! command -v make >/dev/null 2>&1; then
    missing+=(ninja-build)
  fi
  [[ -f /usr/include/boost/hana.hpp ]] || missing+=(libboost-dev)
  [[ -f /usr/include/doctest/doctest.h ]] || missing+=(doctest-dev)
  [[ -f /usr/include/dlpack/dlpack.h ]] || missing+=(libdlpack-dev)  # interop/dlpack.hpp and its tests
  command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)  # the launch.mpirun test
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  [[ -x /usr/bin/time ]] || missing+=(time)  # bench/compile_time.sh measures CPU seconds with it
  ((${#missing[@]} == 0)) && return 0

  apt_install "${missing[@]}" && return 0
  cat >&2 <<MSG
error: could not install the build dependencies automatically.
Missing: ${missing[*]}
On Debian/Ubuntu:  sudo apt-get install ${missing[*]}
Elsewhere: a C++20 compiler (g++ >= 12), CMake >= 3.24, Ninja or make, Boost >= 1.71 headers
(Boost.Hana), doctest, ccache and pkg-config.
MSG
  exit 1
}

# ccgraph_configure BUILD_DIR [cmake args...]: configures BUILD_DIR (Ninja when available).
ccgraph_configure() {
  local dir=$1
  shift
  local gen=()
  if [[ ! -f $dir/CMakeCache.txt ]] && command -v ninja >/dev/null 2>&1; then
    gen=(-G Ninja)
  fi
  log "configure $dir"
  cmake -S "$CCGRAPH_ROOT" -B "$dir" "${gen[@]}" "$@"
}

# ccgraph_build BUILD_DIR [targets...]: builds BUILD_DIR (all targets by default) with
# CCGRAPH_JOBS parallel jobs (default: the number of cores).
ccgraph_build() {
  local dir=$1
  shift
  local targets=()
  (($# > 0)) && targets=(--target "$@")
  log "build $dir ${*:-}"
  cmake --build "$dir" --parallel "${CCGRAPH_JOBS:-$(nproc_or_2)}" "${targets[@]}"
}

# record_result NAME TOTAL FAILED STATUS: one line of the final summary (see test.sh).
record_result() {
  [[ -n ${CCGRAPH_SUMMARY_FILE:-} ]] && echo "$*" >>"$CCGRAPH_SUMMARY_FILE"
  return 0
}

# ccgraph_ctest NAME BUILD_DIR [ctest args...]: runs ctest in BUILD_DIR (without the GPU tests
# when there is no GPU) and records the counts for the summary.
ccgraph_ctest() {
  local name=$1 dir=$2
  shift 2
  local args=(--test-dir "$dir" --output-on-failure --no-tests=error
              --parallel "$(nproc_or_2)" "$@")
  if ! have_gpu; then
    args+=(-LE gpu)
  fi
  log "ctest $name ($dir)"
  local logfile="$dir/ctest-output.log" rc=0
  # CCGRAPH_CTEST_PREFIX (an array) wraps ctest, e.g. in `setarch -R` for TSan.
  ${CCGRAPH_CTEST_PREFIX[@]+"${CCGRAPH_CTEST_PREFIX[@]}"} ctest "${args[@]}" --output-log "$logfile" || rc=$?
  local line total=0 failed=0
  line=$(grep -E '[0-9]+ tests? failed out of [0-9]+' "$logfile" | tail -1 || true)
  if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=${BASH_REMATCH[1]}
    total=${BASH_REMATCH[2]}
  fi
  if ((rc != 0 && failed == 0)); then failed=1; total=$((total > 0 ? total : 1)); fi
  record_result "$name" "$total" "$failed" "$([[ $rc -eq 0 ]] && echo ok || echo tests-failed)"
  return "$rc"
}

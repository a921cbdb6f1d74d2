#!/usr/bin/env bash
# Conan test: packages ccgraph with Conan 2 (conanfile.py) and builds and runs test_package/
# (a two-rank all_reduce, checked) against it, for real.
#
#  1. conan: Conan $CCGRAPH_CONAN_VERSION from PyPI, in a virtual environment kept in
#     ~/.cache/ccgraph (installed once); a fresh CONAN_HOME in the work directory, with the
#     detected profile, used through packaging/conan/profiles/ccgraph (adds cppstd=20).
#  2. boost: ConanCenter is not needed. By default the remotes are disabled and Boost comes from
#     packaging/conan/recipes/boost (this machine's Boost headers, packaged as boost/<version>).
#     CCGRAPH_CONAN_REMOTE=conancenter uses ConanCenter's boost (header_only=True) instead.
#  3. create: `conan create .` with test_package/ (copied into the work directory, so the
#     source tree stays clean). CCGRAPH_CONAN_TESTS=1 also builds and runs ccgraph's CPU test
#     executable inside Conan, against the Conan-provided Boost and doctest
#     (tools.build:skip_test=False; doctest from packaging/conan/recipes/doctest): slow (the
#     whole test suite compiles), so not run by default.
#
# Work directory: $CCGRAPH_CONAN_DIR (default build-conan/), emptied first. Each step is one line
# of test.sh's summary ("conan"); exits non-zero on any failure.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

ensure_deps

conan_version=${CCGRAPH_CONAN_VERSION:-2.34.0}
remote=${CCGRAPH_CONAN_REMOTE:-local}
[[ $remote == local || $remote == conancenter ]] ||
  die "CCGRAPH_CONAN_REMOTE must be 'local' or 'conancenter', not '$remote'"
work=${CCGRAPH_CONAN_DIR:-$CCGRAPH_ROOT/build-conan}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/ccgraph/conan-$conan_version
start=$SECONDS

total=0
failed=0
failures=()
# step NAME FUNCTION: runs FUNCTION (output to $work/NAME.log, shown on failure), counts it.
step() {
  local name=$1 fn=$2 t0=$SECONDS
  total=$((total + 1))
  if "$fn" >"$work/$name.log" 2>&1; then
    printf '  %-16s ok     (%d s)\n' "$name" $((SECONDS - t0))
    return 0
  fi
  printf '  %-16s FAILED (%d s); the end of its log:\n' "$name" $((SECONDS - t0))
  tail -n 100 "$work/$name.log" | sed 's/^/    | /'
  failed=$((failed + 1))
  failures+=("$name")
  return 1
}

finish() {
  record_result conan "$total" "$failed" "$( ((failed == 0)) && echo ok || (IFS=,; echo "failed:${failures[*]}"))"
  log "conan: $((total - failed)) of $total steps passed ($((SECONDS - start)) s)"
  exit $((failed == 0 ? 0 : 1))
}

# Functions run inside `if` (set -e is off there): every step ends with `|| return 1`.

install_conan() {
  if [[ -x $venv/bin/conan ]] && "$venv/bin/conan" --version | grep -q " $conan_version\$"; then
    echo "Conan $conan_version already installed in $venv"
    return 0
  fi
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3 python3-venv || return 1
  fi
  rm -rf "$venv"
  python3 -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "conan==$conan_version" || return 1
  "$venv/bin/conan" --version || return 1
}

conan() { "$venv/bin/conan" "$@"; }

# Arguments every create gets: the profile on both contexts, our parallelism, Ninja if there.
common_args=(--profile:all="$CCGRAPH_ROOT/packaging/conan/profiles/ccgraph"
             -c "tools.build:jobs=${CCGRAPH_JOBS:-$(nproc_or_2)}")
command -v ninja >/dev/null 2>&1 && common_args+=(-c tools.cmake.cmaketoolchain:generator=Ninja)
[[ $remote == local ]] && common_args+=(--no-remote)

setup_home() {
  conan profile detect || return 1
  if [[ $remote == local ]]; then
    conan remote disable conancenter || return 1
  fi
  conan remote list || return 1
}

local_recipes() {
  conan create packaging/conan/recipes/boost "${common_args[@]}" || return 1
  if [[ ${CCGRAPH_CONAN_TESTS:-0} == 1 ]]; then
    conan create packaging/conan/recipes/doctest "${common_args[@]}" || return 1
  fi
}

create_ccgraph() {
  cp -r test_package "$work/test_package" || return 1
  local extra=()
  if [[ ${CCGRAPH_CONAN_TESTS:-0} == 1 ]]; then
    extra=(-c tools.build:skip_test=False)
  fi
  conan create . --test-folder="$work/test_package" "${common_args[@]}" ${extra[@]+"${extra[@]}"} || return 1
  grep -q 'two-rank all_reduce ok' "$work/create.log" || { echo "test_package did not report success"; return 1; }
}

log "conan test (Conan $conan_version, boost from: $remote, work directory $work)"
export CONAN_HOME=$work/home
step conan-install install_conan || finish
step conan-home setup_home || finish
if [[ $remote == local ]]; then
  step local-recipes local_recipes || finish
fi
step create create_ccgraph || true
finish

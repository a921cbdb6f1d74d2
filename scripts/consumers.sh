#!/usr/bin/env bash
# Consumer tests: ccgraph used the ways users take it, each for real.
#
#  1. install: `cmake --install` into a fresh staging prefix, then moved elsewhere (the CMake
#     package and the .pc file must be relocatable); the installed files are checked.
#  2. find_package: tests/consumers/find_package against that prefix (asking for this version
#     and the optional `cuda` component), built and run: a two-rank all_reduce, checked.
#  3. add_subdirectory: tests/consumers/add_subdirectory on the source tree, built and run.
#  4. pkg-config: tests/consumers/pkg_config/Makefile, `pkg-config --cflags ccgraph`, no CMake,
#     built and run.
#  5. README.md's complete program, compiled (through pkg-config) and run.
#  6. configure-only checks (no compile): find_package from the build tree's export
#     (ccgraph_DIR=<build>/ccgraph-package), FetchContent, and a version the package must refuse
#     (SameMinorVersion).
#
# Work directory: $CCGRAPH_CONSUMERS_DIR (default build-consumers/), emptied first. Consumers
# compile once each (ccache when present), without optimisation: a few tens of seconds.
# Each check is one line of test.sh's summary ("consumers"); exits non-zero on any failure.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

ensure_deps

work=${CCGRAPH_CONSUMERS_DIR:-$CCGRAPH_ROOT/build-consumers}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
src=$CCGRAPH_ROOT/tests/consumers
prefix=$work/prefix
start=$SECONDS

version=$(sed -nE 's/^ *VERSION ([0-9]+\.[0-9]+\.[0-9]+).*/\1/p' CMakeLists.txt | head -1)
[[ -n $version ]] || die "cannot read the project version from CMakeLists.txt"
IFS=. read -r v_major v_minor _ <<<"$version"

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)

total=0
failed=0
failures=()
# check NAME FUNCTION: runs FUNCTION (output to $work/NAME.log, shown on failure), counts it.
check() {
  local name=$1 fn=$2 t0=$SECONDS
  total=$((total + 1))
  if "$fn" >"$work/$name.log" 2>&1; then
    printf '  %-28s ok     (%d s)\n' "$name" $((SECONDS - t0))
  else
    printf '  %-28s FAILED (%d s); the end of its log:\n' "$name" $((SECONDS - t0))
    tail -n 100 "$work/$name.log" | sed 's/^/    | /'
    failed=$((failed + 1))
    failures+=("$name")
  fi
}

# Functions run inside `if` (set -e is off there): every step ends with `|| return 1`.

install_prefix() {
  cmake -S "$CCGRAPH_ROOT" -B "$work/ccgraph-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCCGRAPH_BUILD_TESTS=OFF -DCCGRAPH_BUILD_EXAMPLES=OFF -DCCGRAPH_BUILD_BENCH=OFF \
    -DCMAKE_INSTALL_PREFIX="$work/stage" || return 1
  cmake --build "$work/ccgraph-build" || return 1
  cmake --install "$work/ccgraph-build" || return 1
  # Relocatable: everything below must work from where the prefix is moved to.
  mv "$work/stage" "$prefix" || return 1
  local f
  for f in include/ccgraph/ccgraph.hpp include/ccgraph/cuda.hpp include/ccgraph/impl/src.hpp \
           include/ccgraph/ir/impl/graph.ipp \
           share/cmake/ccgraph/ccgraphConfig.cmake share/cmake/ccgraph/ccgraphConfigVersion.cmake \
           share/cmake/ccgraph/ccgraphTargets.cmake share/cmake/ccgraph/FindNCCL.cmake \
           share/pkgconfig/ccgraph.pc; do
    [[ -f $prefix/$f ]] || { echo "not installed: $f"; return 1; }
  done
  if grep -rq "$work/stage\|$CCGRAPH_ROOT" "$prefix/share"; then
    echo "the installed package files name the build or source tree:"
    grep -rn "$work/stage\|$CCGRAPH_ROOT" "$prefix/share"
    return 1
  fi
  echo "installed $(find "$prefix" -type f | wc -l) files"
}

# consumer_cmake NAME SOURCE_SUBDIR [cmake args...]: configure and build one CMake consumer.
consumer_cmake() {
  local name=$1 dir=$2
  shift 2
  cmake -S "$src/$dir" -B "$work/$name" "${gen[@]}" "${launcher[@]}" "$@" || return 1
  cmake --build "$work/$name" || return 1
}

find_package_consumer() {
  consumer_cmake find_package find_package -DCMAKE_PREFIX_PATH="$prefix" \
    -DCCGRAPH_CONSUMER_VERSION="$v_major.$v_minor" -DCCGRAPH_CONSUMER_CUDA=ON || return 1
  # It must have found the package in the prefix, not some other ccgraph on the machine.
  grep -qx "ccgraph_DIR:PATH=$prefix/share/cmake/ccgraph" "$work/find_package/CMakeCache.txt" ||
    { echo "ccgraph was not found in $prefix"; grep ccgraph_DIR "$work/find_package/CMakeCache.txt"; return 1; }
  "$work/find_package/consumer" || return 1
}

add_subdirectory_consumer() {
  consumer_cmake add_subdirectory add_subdirectory -DCCGRAPH_SOURCE_DIR="$CCGRAPH_ROOT" || return 1
  "$work/add_subdirectory/consumer" || return 1
}

pkg_config_consumer() {
  mkdir -p "$work/pkg_config" || return 1
  local pc=(env PKG_CONFIG_PATH="$prefix/share/pkgconfig")
  local got
  got=$("${pc[@]}" pkg-config --modversion ccgraph) || return 1
  [[ $got == "$version" ]] || { echo "pkg-config --modversion ccgraph: $got, expected $version"; return 1; }
  echo "pkg-config --cflags --libs ccgraph: $("${pc[@]}" pkg-config --cflags --libs ccgraph)"
  local cxx=${CXX:-g++}
  command -v ccache >/dev/null 2>&1 && cxx="ccache $cxx"
  "${pc[@]}" make -C "$work/pkg_config" -f "$src/pkg_config/Makefile" CXX="$cxx" || return 1
  "$work/pkg_config/consumer" || return 1
}

# README.md's "A complete program", compiled as printed (through pkg-config) and run: the
# README promises a complete program of at most 20 lines.
readme_program() {
  mkdir -p "$work/readme" || return 1
  awk '/^## A complete program/ { f = 1 } f && /^```cpp/ { p = 1; next } p && /^```/ { exit } p' \
    "$CCGRAPH_ROOT/README.md" >"$work/readme/program.cpp" || return 1
  local lines
  lines=$(wc -l <"$work/readme/program.cpp")
  echo "README program: $lines lines"
  ((lines > 0 && lines <= 20)) || { echo "expected 1 to 20 lines"; return 1; }
  local pc=(env PKG_CONFIG_PATH="$prefix/share/pkgconfig")
  local cxx=(${CXX:-g++})
  command -v ccache >/dev/null 2>&1 && cxx=(ccache "${cxx[@]}")
  # shellcheck disable=SC2046  # pkg-config output is a list of flags
  "${cxx[@]}" -std=c++20 $("${pc[@]}" pkg-config --cflags ccgraph) "$work/readme/program.cpp" \
    -o "$work/readme/program" $("${pc[@]}" pkg-config --libs ccgraph) || return 1
  "$work/readme/program" || return 1
}

# The same README program under separate compilation (core/config.hpp), from the installed
# headers: its unit and one that includes <ccgraph/impl/src.hpp>, both with the macro, linked.
readme_program_separate() {
  mkdir -p "$work/readme_separate" || return 1
  [[ -f $work/readme/program.cpp ]] || { echo "readme-program did not write program.cpp"; return 1; }
  printf '#include <ccgraph/impl/src.hpp>\n' >"$work/readme_separate/ccgraph.cpp" || return 1
  local pc=(env PKG_CONFIG_PATH="$prefix/share/pkgconfig")
  local cxx=(${CXX:-g++})
  command -v ccache >/dev/null 2>&1 && cxx=(ccache "${cxx[@]}")
  local f
  for f in "$work/readme/program.cpp" "$work/readme_separate/ccgraph.cpp"; do
    # shellcheck disable=SC2046  # pkg-config output is a list of flags
    "${cxx[@]}" -std=c++20 -DCCGRAPH_SEPARATE_COMPILATION $("${pc[@]}" pkg-config --cflags ccgraph) -c "$f" \
      -o "$work/readme_separate/$(basename "$f" .cpp).o" || return 1
  done
  # shellcheck disable=SC2046
  "${cxx[@]}" "$work/readme_separate/program.o" "$work/readme_separate/ccgraph.o" \
    -o "$work/readme_separate/program" $("${pc[@]}" pkg-config --libs ccgraph) || return 1
  "$work/readme_separate/program" || return 1
}

# Configure-only checks: generating fails when ccgraph::ccgraph is missing or broken.
build_tree_export() {
  cmake -S "$src/find_package" -B "$work/build_tree" "${gen[@]}" \
    -Dccgraph_DIR="$work/ccgraph-build/ccgraph-package" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF || return 1
}

fetchcontent_configure() {
  cmake -S "$src/add_subdirectory" -B "$work/fetchcontent" "${gen[@]}" \
    -DCCGRAPH_SOURCE_DIR="$CCGRAPH_ROOT" -DCCGRAPH_CONSUMER_FETCHCONTENT=ON || return 1
}

version_refused() {
  local wrong="$v_major.$((v_minor + 1))"
  if cmake -S "$src/find_package" -B "$work/wrong_version" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
       -DCCGRAPH_CONSUMER_VERSION="$wrong"; then
    echo "find_package(ccgraph $wrong) accepted version $version"
    return 1
  fi
  echo "find_package(ccgraph $wrong) refused $version, as it should"
}

log "consumer tests (ccgraph $version, work directory $work)"
check install install_prefix
if [[ -z ${failures[*]:-} ]]; then
  check find_package find_package_consumer
  check pkg-config pkg_config_consumer
  check readme-program readme_program
  check readme-program-separate readme_program_separate
  check build-tree-export build_tree_export
  check version-refused version_refused
fi
check add_subdirectory add_subdirectory_consumer
check fetchcontent fetchcontent_configure

record_result consumers "$total" "$failed" "$( ((failed == 0)) && echo ok || (IFS=,; echo "failed:${failures[*]}"))"
log "consumer tests: $((total - failed)) of $total passed ($((SECONDS - start)) s)"
((failed == 0))

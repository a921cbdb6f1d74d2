#!/usr/bin/env bash
# Compile time of ccgraph's entry headers and of a small program, in CPU seconds (user + sys) and
# peak memory, one compile after the other on this machine: an empty file including
# <ccgraph/ccgraph.hpp> (-fsyntax-only and -c -O0), the same with the schedule passes and
# compile_function, and the README's first program (built and linked at -O0 and at -O2); then the
# same under separate compilation (CCGRAPH_SEPARATE_COMPILATION: the umbrella, the README
# program's own unit, and the unit of <ccgraph/impl/src.hpp> that a program compiles once).
# Prints a table; with --check, exits 1 when a number exceeds its loose bound (a regression
# check for CI, not the targets: the targets are in bench/RESULTS.md).
#
# Usage: bash bench/compile_time.sh [--check]    (CXX picks the compiler, default g++)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CXX=${CXX:-g++}
check=0
[[ ${1:-} == --check ]] && check=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <ccgraph/ccgraph.hpp>\n' >"$tmp/umbrella.cpp"
printf '#include <ccgraph/ccgraph.hpp>\n#include <ccgraph/runtime/compiled_function.hpp>\n#include <ccgraph/schedule/schedule.hpp>\n' >"$tmp/umbrella_schedule.cpp"
# The README's first program, as scripts/consumers.sh extracts it.
awk '/^```cpp$/ && !done {on=1; next} /^```$/ && on {done=1; on=0} on' "$HERE/README.md" >"$tmp/readme.cpp"
flags=(-std=c++20 -I"$HERE/include" -pthread)

printf '%-44s %9s %9s %7s\n' "translation unit" "CPU s" "peak MiB" "bound"
failed=0
# measure NAME BOUND_S CMD...: CPU seconds of CMD (user + sys of it and its children).
measure() {
  local name=$1 bound=$2
  shift 2
  if ! /usr/bin/time -o "$tmp/stats" -f '%U %S %M' "$@" >/dev/null 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    echo "compile_time.sh: $name failed to compile" >&2
    exit 2
  fi
  local stats
  stats=$(tail -1 "$tmp/stats")
  local cpu mib
  cpu=$(awk '{printf "%.2f", $1 + $2}' <<<"$stats")
  mib=$(awk '{printf "%.0f", $3 / 1024}' <<<"$stats")
  printf '%-44s %9s %9s %7s\n' "$name" "$cpu" "$mib" "$bound"
  if ((check)) && awk -v c="$cpu" -v b="$bound" 'BEGIN { exit !(c > b) }'; then
    echo "compile_time.sh: $name took $cpu s of CPU, over its bound of $bound s" >&2
    failed=1
  fi
}
measure "umbrella, -fsyntax-only" 15 "$CXX" "${flags[@]}" -fsyntax-only "$tmp/umbrella.cpp"
measure "umbrella, -c -O0" 16 "$CXX" "${flags[@]}" -c -O0 "$tmp/umbrella.cpp" -o "$tmp/u.o"
measure "umbrella + schedule + compile_function, -c" 17 "$CXX" "${flags[@]}" -c -O0 "$tmp/umbrella_schedule.cpp" -o "$tmp/us.o"
measure "README program, -O0, linked" 34 "$CXX" "${flags[@]}" -O0 "$tmp/readme.cpp" -o "$tmp/readme0"
measure "README program, -O2, linked" 58 "$CXX" "${flags[@]}" -O2 "$tmp/readme.cpp" -o "$tmp/readme2"
printf '#include <ccgraph/impl/src.hpp>\n' >"$tmp/src.cpp"
sep=("${flags[@]}" -DCCGRAPH_SEPARATE_COMPILATION)
measure "separate: umbrella, -fsyntax-only" 9 "$CXX" "${sep[@]}" -fsyntax-only "$tmp/umbrella.cpp"
measure "separate: README program's unit, -c -O0" 20 "$CXX" "${sep[@]}" -c -O0 "$tmp/readme.cpp" -o "$tmp/rs.o"
# 150: it also compiles the executor, which every unit that runs a graph compiled before (ca. 100 s).
measure "separate: impl/src.hpp (once), -c -O2" 150 "$CXX" "${sep[@]}" -c -O2 "$tmp/src.cpp" -o "$tmp/src.o"
measure "separate: README program linked, -O0" 5 "$CXX" "$tmp/rs.o" "$tmp/src.o" -pthread -o "$tmp/readme_sep"
"$tmp/readme_sep" >/dev/null || { echo "compile_time.sh: the separately compiled README program failed" >&2; exit 2; }
exit "$failed"

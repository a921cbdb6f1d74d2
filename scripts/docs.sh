#!/usr/bin/env bash
# Builds the generated parts of the documentation:
#  1. docs/images/<pass>.png, the timelines of docs/scheduling.md: builds and runs
#     docs/timelines/timelines.cpp (`docs_timelines`), which writes each pass's predicted
#     timelines before and after as Chrome traces plus a text report
#     (<build>/docs/timelines/report.md, the overlap reports quoted in scheduling.md), then
#     renders the traces with docs/timelines/render.py (matplotlib, installed from PyPI into a
#     virtual environment in ~/.cache/ccgraph/docs-venv).
#  2. the API reference, `cmake --build <build> --target docs` (Doxygen), when Doxygen is
#     installed (Debian/Ubuntu: apt-get install doxygen): <build>/docs/api/html/index.html.
# Build directory: $CCGRAPH_DOCS_BUILD_DIR (default build/).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

ensure_deps
build=${CCGRAPH_DOCS_BUILD_DIR:-build}
ccgraph_configure "$build" -DCMAKE_BUILD_TYPE=Release -DCCGRAPH_BUILD_DOCS=ON
ccgraph_build "$build" docs_timelines

out=$build/docs/timelines
rm -rf "$out"
mkdir -p "$out"
log "docs_timelines -> $out"
"$build/docs/docs_timelines" "$out" >"$out/report.md"

venv=${XDG_CACHE_HOME:-$HOME/.cache}/ccgraph/docs-venv
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib into $venv"
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3 python3-venv || die "python3 with venv is needed: apt-get install python3-venv"
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "matplotlib>=3.7,<4"
fi
log "render -> docs/images"
"$venv/bin/python" docs/timelines/render.py "$out" docs/images

if command -v doxygen >/dev/null 2>&1; then
  ccgraph_build "$build" docs
  log "API reference: $build/docs/api/html/index.html (warnings: $build/docs/doxygen-warnings.log)"
else
  warn "Doxygen is not installed: no API reference (apt-get install doxygen)"
fi

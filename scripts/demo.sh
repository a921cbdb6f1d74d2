#!/usr/bin/env bash
# Builds and runs the first example, examples/01_buffer_reuse.cpp, from build/.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$CCGRAPH_ROOT"

[[ -f examples/01_buffer_reuse.cpp ]] || die "examples/01_buffer_reuse.cpp does not exist yet"
ensure_deps
ccgraph_configure build -DCMAKE_BUILD_TYPE=Release -DCCGRAPH_BUILD_EXAMPLES=ON
ccgraph_build build example_01_buffer_reuse
log "examples/01_buffer_reuse"
exec build/examples/example_01_buffer_reuse "$@"

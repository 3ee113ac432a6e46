#!/usr/bin/env bash
# Quick start: install what is missing, build the `ldlm` tool (Release,
# -march=native) and run the demo: the full LDLM pipeline with embedded random
# weights. Extra arguments are passed to `ldlm generate`.
#
#   bash tools/quickstart.sh [ldlm generate options...]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

bash "$root/tools/install-deps.sh"
# `cmake --preset` and `cmake --build --preset` read CMakePresets.json from the
# current directory.
(
  cd "$root"
  cmake --preset default
  cmake --build --preset default --target ldlm_cli
)
exec "$root/build/default/tools/ldlm" generate "$@"

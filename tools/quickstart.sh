#!/usr/bin/env bash
# Quick start: install what is missing, build the `ldlm` tool (Release,
# -march=native) and run the demo with the built-in trained model
# (tools/assets/ldlm-demo): a generation, a reconstruction of a sentence, then text in:
# a masked word filled in, and a prompt continued.
# Extra arguments are passed to `ldlm generate` (e.g. --seed 3 --length 96).
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
ldlm="$root/build/default/tools/ldlm"
sentence="The old man walked slowly to the market to buy bread and fresh fruit."

echo
echo "== ldlm generate --length 64 $*   (denoiser sampling, then the decoders)"
"$ldlm" generate --length 64 "$@"
echo
echo "== ldlm reconstruct --text \"$sentence\"   (encoder to latents, decoders back to text)"
"$ldlm" reconstruct --text "$sentence"
infill_text="The children played in the <|mask|> after school."
echo
echo "== ldlm infill --text \"$infill_text\"   (the masked token sampled, the rest kept)"
"$ldlm" infill --text "$infill_text"
echo
echo "== ldlm generate --prompt \"The old man\" --length 24   (a prompt continued)"
"$ldlm" generate --prompt "The old man" --length 24

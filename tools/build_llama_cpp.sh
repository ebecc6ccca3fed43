#!/bin/bash
# Installs llama-cpp-python built from its PyPI sdist with SpecLens's small-batch Q4_K/Q6_K kernels, grouped
# attention and an ordered cache (native/llama.cpp/README.md says what they change and why) into the active Python
# environment: about 8 minutes on 2 cores. The version is pinned because the patches are written against that
# release's vendored llama.cpp.
# Usage: tools/build_llama_cpp.sh
set -euo pipefail
version=0.3.36
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$version" >/dev/null
tar xzf "llama_cpp_python-$version.tar.gz"
cd "llama_cpp_python-$version"
cp "$here/native/llama.cpp/kquant_rows.h" vendor/llama.cpp/ggml/src/ggml-cpu/speclens_kquant_rows.h
git apply -p1 "$here/native/llama.cpp/repack.cpp.patch"   # git rather than patch(1), which a fresh machine may lack
git apply -p1 "$here/native/llama.cpp/attention.patch"
git apply -p1 "$here/native/llama.cpp/kv_order.patch"
# the compiler's output goes to a log that is shown only when the build fails
log=$work/build.log
python -m pip install -q --no-deps --force-reinstall . >"$log" 2>&1 || { tail -n 40 "$log" >&2; exit 1; }
# its dependencies (numpy, jinja2, ...) come with the project's install; say what was built without importing it
python "$here/core/backends/kquant_kernels.py"

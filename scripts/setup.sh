#!/usr/bin/env bash
# One-time setup for running and testing kvrun on Debian/Ubuntu (idempotent, needs root or sudo
# only when something is missing):
#   1. a Vulkan driver: lavapipe (Mesa's software Vulkan) unless a Vulkan driver is installed;
#   2. python3 + pip, which scripts/fetch-models.sh downloads with, and Debian's chromium with
#      its chromedriver (the chat page's browser test);
#   3. the Python packages tests/python/ needs (openai, anthropic, prometheus-client,
#      jsonschema, selenium; gguf and numpy for scripts/make_hostile_inputs.py);
#   4. the test models (scripts/fetch-models.sh: SmolLM2 135M, Gemma 3 270M) and llama.cpp's tokenizer test data
#      (scripts/fetch-llama-cpp-vocabs.sh) into the git-ignored assets/models/.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi

vulkan_loader() { { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep 'libvulkan\.so\.1' >/dev/null; }
vulkan_driver() { compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null || compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null; }
if vulkan_loader && vulkan_driver; then
    echo "a Vulkan loader and driver are installed"
else
    scripts/install-lavapipe.sh
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq python3 python3-pip >/dev/null
    echo "installed python3 and pip"
fi

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    echo "chromium and chromedriver are installed"
else
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
    echo "installed chromium and chromium-driver"
fi

# The packages of tests/python/openai_client_test.py and of scripts/make_hostile_inputs.py
# (tests/hostile_inputs.rs): into the active virtual environment, else
# into the system's Python as root and into the user's site-packages otherwise. Debian 12+ marks
# its Python externally managed (PEP 668), so pip refuses that; then retry with
# --break-system-packages (pip 23.0.1+, as Debian 12 ships).
py_packages=(openai anthropic prometheus-client gguf numpy jsonschema selenium)
if python3 -c 'import openai, anthropic, prometheus_client.openmetrics.parser, gguf, numpy, jsonschema, selenium' >/dev/null 2>&1; then
    echo "the Python test packages (${py_packages[*]}) are installed"
else
    export PIP_ROOT_USER_ACTION=ignore # no "running pip as root" warning
    pip_args=(install --quiet --disable-pip-version-check)
    in_venv=$(python3 -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
    if [ "$(id -u)" != 0 ] && [ "$in_venv" = 0 ]; then pip_args+=(--user); fi
    pip_log=$(mktemp)
    if ! python3 -m pip "${pip_args[@]}" "${py_packages[@]}" 2>"$pip_log"; then
        if grep -q externally-managed-environment "$pip_log"; then
            python3 -m pip "${pip_args[@]}" --break-system-packages "${py_packages[@]}"
        else
            cat "$pip_log" >&2
            rm -f "$pip_log"
            exit 1
        fi
    fi
    rm -f "$pip_log"
    python3 -c 'import openai, prometheus_client.openmetrics.parser'
    echo "installed the Python test packages (${py_packages[*]})"
fi

scripts/fetch-models.sh
scripts/fetch-llama-cpp-vocabs.sh

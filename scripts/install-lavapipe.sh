#!/usr/bin/env bash
# Installs Mesa's software Vulkan driver (lavapipe) when no Vulkan device is present, so kvrun
# runs on a machine without a GPU. Debian/Ubuntu (apt-get); needs root or sudo.
set -euo pipefail
if ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 && { ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep libvulkan.so.1 >/dev/null; then
    echo "lavapipe already installed"
    exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
echo "installed lavapipe (mesa-vulkan-drivers) and the Vulkan loader"

#!/bin/sh
# bench/gpu/fetch-debs.sh — download (not install) the Vulkan loader and GL dispatch
# packages into .gpu-debs/ at the repository root, for a GPU machine without network:
# bench/gpu/run unpacks them there with dpkg -x. Needs apt's package lists (apt-get update).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.gpu-debs"
cd "$root/.gpu-debs"
apt-get download libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2
ls -l ./*.deb

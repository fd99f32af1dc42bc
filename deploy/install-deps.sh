#!/bin/sh
# deploy/install-deps.sh — everything a fresh Debian 12 machine needs to build, test and
# run kiln. Used by the README, .ci/run and deploy/Dockerfile; safe to run again.
#
#   deploy/install-deps.sh            build + test + run dependencies
#   KILN_DEPS_MINIMAL=1 deploy/...    only what building and running kilnd needs
set -eu

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -E "$0" "$@"
    fi
    echo "install-deps: run as root (or install sudo)" >&2
    exit 1
fi

build_packages="
  ca-certificates gcc libc6-dev pkg-config meson ninja-build
  libuv1-dev libcjson-dev libopenblas-dev libzstd-dev libsqlite3-dev libxxhash-dev libzip-dev node-llhttp
  zlib1g-dev libspng-dev libjpeg62-turbo-dev libwslay-dev libncurses-dev
  libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler
"
test_packages="
  libcmocka-dev python3 python3-venv curl wrk nghttp2-client nginx-light clang clang-format libclang-rt-14-dev
  mesa-vulkan-drivers libvulkan-dev glslang-tools glslc hipcc sqlite3 libjemalloc2 dataset-fashion-mnist tmux
  libshaderc-dev spirv-tools
  systemd util-linux
"
# glslc and the Vulkan packages build and test the vulkan backend on lavapipe; hipcc compiles the
# CUDA kernels for AMD GPUs (the `hip` suite, a compile check: no AMD GPU is needed).
# libshaderc-dev (with glslang-dev and spirv-tools, whose static libraries it links) lets the
# vulkan backend compile fused kernels at run time.
# The deploy suite builds and runs the container image with podman (buildah builds, runc runs
# where crun cannot, debootstrap makes the base image from Debian's mirror when no container
# registry is reachable), renders the Kubernetes manifests with kubectl's kustomize and
# parses deploy/compose.yaml with podman-compose.
container_packages="
  podman buildah runc crun conmon containernetworking-plugins iptables slirp4netns
  fuse-overlayfs uidmap debootstrap podman-compose
"

packages="$build_packages"
if [ "${KILN_DEPS_MINIMAL:-0}" != 1 ]; then
    packages="$packages $test_packages $container_packages"
    # Debian's kubectl (kubernetes-client) only where no kubectl is installed: another
    # kubectl package owns the same file.
    if ! command -v kubectl >/dev/null 2>&1; then
        packages="$packages kubernetes-client"
    fi
fi

missing=""
for p in $packages; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing
fi
echo "install-deps: all dependencies present"

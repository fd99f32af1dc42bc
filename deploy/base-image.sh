#!/bin/sh
# deploy/base-image.sh [TAG] — make a Debian 12 base image from Debian's package mirror, for
# machines that reach Debian's mirror but no container registry (deploy/Dockerfile's default
# base, debian:12-slim, comes from a registry). Prints the tag it made or found.
#
#   deploy/base-image.sh                       -> localhost/kiln-base:bookworm
#   KILN_DEBIAN_MIRROR=http://... deploy/...   another mirror
#
# An image already stored under TAG is reused (podman keeps its storage across runs), so only
# the first run on a machine pays for debootstrap (about two minutes). The root file system is
# trimmed the way the slim images are (no documentation, manual pages, locales, apt lists or
# downloaded packages), and dpkg is told to keep skipping those folders, so packages installed
# on top stay small too.
set -eu
tag=${1:-localhost/kiln-base:bookworm}
mirror=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if podman image exists "$tag"; then
    echo "$tag"
    exit 0
fi
for tool in podman debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
    command -v "$tool" >/dev/null 2>&1 || {
        echo "base-image: $tool is missing (deploy/install-deps.sh installs it)" >&2
        exit 1
    }
done

rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT INT TERM
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >&2

cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
SOURCES
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/kiln-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
cat >"$rootfs/etc/apt/apt.conf.d/kiln-slim" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Acquire::Languages "none";
APT
find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs/usr/share/man"/* "$rootfs/usr/share/info"/* "$rootfs/usr/share/locale"/* \
    "$rootfs/var/cache/apt"/*.bin "$rootfs/var/cache/apt/archives"/*.deb \
    "$rootfs/var/lib/apt/lists"/* "$rootfs/var/log"/*.log "$rootfs/var/log/apt"/*

tar -C "$rootfs" --numeric-owner -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$tag" >&2
echo "$tag"

#!/usr/bin/env bash
# Podman on a CI machine without Docker Hub: install it (Debian packages), configure it under the build
# directory, and make the base image locally. Source it: `. deploy/ci/podman.sh` (sets CONTAINERS_CONF,
# CONTAINERS_STORAGE_CONF and BASE_IMAGE). Fails loudly, with the reason, when any step cannot be done.
set -euo pipefail

IMAGE_BUILD=${IMAGE_BUILD:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/image}
BASE_IMAGE=localhost/python-base:bookworm
mkdir -p "$IMAGE_BUILD"

fail() { echo "image-test: $*" >&2; exit 1; }

if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || fail "podman and mmdebstrap are missing and only root can install them (apt-get)"
    command -v apt-get >/dev/null || fail "podman is missing and this is not a Debian/Ubuntu machine (no apt-get)"
    echo "image-test: installing podman, buildah, runc, mmdebstrap (apt)"
    apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
        podman buildah runc mmdebstrap uidmap slirp4netns fuse-overlayfs containernetworking-plugins iptables \
        golang-github-containernetworking-plugin-dnsname >/dev/null \
        || fail "apt-get install of podman and co failed"
fi

# runc (crun fails on this kernel's hybrid cgroups), cgroupfs (no systemd as PID 1), ulimits a root without
# CAP_SYS_RESOURCE may set; overlay storage under the build directory (vfs works but is ten times slower).
cat >"$IMAGE_BUILD/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat >"$IMAGE_BUILD/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$IMAGE_BUILD/storage"
runroot = "$IMAGE_BUILD/run"
CONF
export CONTAINERS_CONF=$IMAGE_BUILD/containers.conf CONTAINERS_STORAGE_CONF=$IMAGE_BUILD/storage.conf

# The base: a stand-in for python:3.11-slim-bookworm from Debian packages (python3 3.11, venv, pip; no PEP 668
# marker, like the real image), with the machine's extra CA certificates so pip in the build trusts what the
# host trusts. Made once per build directory.
if ! podman image exists "$BASE_IMAGE"; then
    mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)}
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "image-test: making $BASE_IMAGE with mmdebstrap from $mirror"
    rm -f "$IMAGE_BUILD/base.tar"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
        --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' \
        --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/ && chroot "$1" update-ca-certificates >/dev/null; fi' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$IMAGE_BUILD/base.tar" "$mirror" || fail "mmdebstrap could not make the base image"
    podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$IMAGE_BUILD/base.tar" "$BASE_IMAGE" >/dev/null \
        || fail "podman import of the base image failed"
    rm -f "$IMAGE_BUILD/base.tar"
fi
export BASE_IMAGE

#!/usr/bin/env bash
# Install what `make images` needs where neither docker nor podman is there: Debian's buildah
# (builds Dockerfiles; as root with --isolation chroot, no daemon) and debootstrap (makes a
# Debian bookworm root filesystem, the base image when a Dockerfile's public base cannot be
# pulled). Does nothing when buildah and debootstrap are already installed.
# Needs root and Debian's package repositories (apt-get).
set -euo pipefail

if command -v buildah >/dev/null && command -v debootstrap >/dev/null && [[ "${FORCE:-0}" != 1 ]]; then
  echo "install-image-tools: $(buildah --version), debootstrap $(debootstrap --version | awk '{print $2}')"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-image-tools: no apt-get here: install docker, podman or buildah yourself" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# apt downloads as root here (not its _apt sandbox user): in containers whose /dev is not a
# real one, _apt cannot write where apt-key sends its output.
apt=(apt-get -o APT::Sandbox::User=root)
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq --no-install-recommends buildah debootstrap fuse-overlayfs uidmap ca-certificates
echo "install-image-tools: $(buildah --version), debootstrap $(debootstrap --version | awk '{print $2}')"

#!/usr/bin/env bash
# Make a Debian bookworm base image (Python 3.11, pip) with debootstrap and buildah, for building
# the Dockerfiles where their public base images cannot be pulled (CI: no registry but Debian's).
#   tools/make-debian-base.sh [IMAGE_NAME]        default: localhost/dtrain-base:bookworm
# The image has python/pip on PATH as the Dockerfiles call them (pip may install into the system
# Python: this is an image, not a host), CA certificates, and useradd. Does nothing when the
# image exists already at this script's BASE_REVISION (FORCE=1 remakes it).
set -euo pipefail

IMAGE="${1:-localhost/dtrain-base:bookworm}"
# The Debian mirror this machine's apt already uses (deb822 or one-line sources), unless given.
host_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}'; } | grep -v -- '-security' | head -1 || true
}
MIRROR="${DEBIAN_MIRROR:-$(host_mirror)}"
if [[ -z "$MIRROR" ]]; then
  echo "make-debian-base: no Debian mirror in this machine's apt sources; set DEBIAN_MIRROR" >&2
  exit 1
fi
BUILDAH="${BUILDAH:-buildah}"
# Raised when what the base holds changes, so that an older one is remade (2: a current pip).
BASE_REVISION=2

existing="$($BUILDAH inspect --type image --format '{{index .ImageAnnotations "dev.dtrain.base-revision"}}' "$IMAGE" 2>/dev/null || true)"
if [[ "$existing" == "$BASE_REVISION" && "${FORCE:-0}" != 1 ]]; then
  echo "make-debian-base: $IMAGE exists"
  exit 0
fi
root="$(mktemp -d /var/tmp/dtrain-base.XXXXXX)"
cleanup() {
  # debootstrap mounts /proc (and maybe more) inside the new root: unmount before removing it.
  grep -o " $root/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf --one-file-system "$root" "$root.log"
}
trap cleanup EXIT
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,passwd \
  bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
# An image's Python is the image's own: pip installs into it (PEP 668's marker is for hosts).
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
ln -sf python3 "$root/usr/bin/python"
ln -sf pip3 "$root/usr/bin/pip"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
container="$($BUILDAH from scratch)"
mount="$($BUILDAH mount "$container")"
cp -a "$root"/. "$mount"/
$BUILDAH umount "$container" >/dev/null
# bookworm's pip (23.0) backtracks for an hour through torch's CUDA wheels on the trainer extra's
# object-storage packages (s3fs, gcsfs); a current pip resolves them in seconds, as the public
# PyTorch bases' pip does. This machine's CA bundle (PIP_CERT, e.g. a proxy's) for this one download.
$BUILDAH run --isolation chroot -v "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}:/tmp/pip-ca.crt:ro" "$container" -- \
  env PIP_FIND_LINKS= PIP_CERT=/tmp/pip-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
  python3 -m pip install --no-cache-dir --quiet --root-user-action=ignore --upgrade 'pip>=25.1' \
  || { echo "make-debian-base: upgrading pip in the base failed (above)" >&2; exit 1; }
$BUILDAH config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash \
  --annotation "dev.dtrain.base-revision=$BASE_REVISION" "$container"
$BUILDAH commit --quiet "$container" "$IMAGE" >/dev/null
$BUILDAH rm "$container" >/dev/null
echo "make-debian-base: $IMAGE ($($BUILDAH inspect --type image --format '{{.FromImageID}}' "$IMAGE" | cut -c1-12))"

#!/usr/bin/env bash
# The operator, trainer and engine images in this machine's containers-storage, built where no
# registry's base image can be pulled: Debian's buildah (--isolation chroot, as root) on a Debian
# bookworm base made by debootstrap, pip using this machine's indexes and wheel caches (torch from
# local files: the build the Makefile pins; it runs on the CPU here), no TensorRT in the engine
# image. Unchanged inputs reuse their layers (buildah --layers), so a second run takes seconds.
# `make cluster` (the kubelet runs pods from these images) and CI (.ci/images) call it.
#   REGISTRY, VERSION: as `make images` (default localhost/dtrain and the package version)
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install-image-tools.sh
BASE=localhost/dtrain-base:bookworm
bash tools/make-debian-base.sh "$BASE"

export CONTAINER_TOOL=buildah
export OPERATOR_BASE="$BASE" TRAINER_BASE="$BASE" ENGINE_BASE="$BASE"
export TORCH_PACKAGES="${CI_TORCH_PACKAGES:-torch==2.14.1 torchvision==0.29.1}"
export ENGINE_EXTRA=trainer REQUIRE_TENSORRT=0
make images ${REGISTRY:+REGISTRY="$REGISTRY"} ${VERSION:+VERSION="$VERSION"}
# A rebuilt image leaves its predecessor untagged, several GB each for the trainer and the engine:
# removed here, so that the image store does not fill the disk build after build.
buildah rmi --prune >/dev/null 2>&1 || true

#!/usr/bin/env bash
# Build (or push) dtrain's three images with whichever of docker, podman or buildah is here:
#   $REGISTRY/dtrain-operator:$VERSION   operator/Dockerfile
#   $REGISTRY/dtrain-trainer:$VERSION    trainer_image/Dockerfile
#   $REGISTRY/dtrain-engine:$VERSION     trainer_image/engine.Dockerfile
# `make images` and `make push` call it. One image at a time, niced: builds are CPU- and disk-heavy.
#
#   tools/build-images.sh [--push] [operator|trainer|engine ...]
#
# Environment:
#   REGISTRY, VERSION          image names (make passes them; defaults localhost/dtrain, the package version)
#   CONTAINER_TOOL             docker, podman or buildah (default: the first that works)
#   OPERATOR_BASE, TRAINER_BASE, ENGINE_BASE
#                              base images (default: each Dockerfile's own: python:3.11-slim,
#                              pytorch/pytorch CUDA, nvcr.io/nvidia/pytorch)
#   TORCH_PACKAGES             torch for a base without it, e.g. "torch==2.13.0+cpu torchvision==0.28.0"
#   ENGINE_EXTRA               dtrain extra of the engine image (default tensorrt; "trainer" without TensorRT)
#   REQUIRE_TENSORRT           1 (default): the engine build fails without TensorRT 10
# pip inside the build uses this machine's pip configuration (index-url, extra-index-url,
# find-links from `pip config list`); with podman or buildah, local index directories and
# wheel caches it names are mounted read-only into the build, so that nothing this machine
# has is downloaded again (never torch from scratch).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-python3}"
REGISTRY="${REGISTRY:-localhost/dtrain}"
VERSION="${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}"
PUSH=0
names=()
for arg in "$@"; do
  case "$arg" in
    --push) PUSH=1 ;;
    operator|trainer|engine) names+=("$arg") ;;
    *) echo "build-images: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ ${#names[@]} -gt 0 ]] || names=(operator trainer engine)

tool="${CONTAINER_TOOL:-}"
if [[ -z "$tool" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then tool=docker
  elif command -v podman >/dev/null; then tool=podman
  elif command -v buildah >/dev/null; then tool=buildah
  else
    echo "build-images: none of docker (with a running daemon), podman or buildah is installed;" \
      "on Debian: sudo bash tools/install-image-tools.sh" >&2
    exit 1
  fi
fi

dockerfile() {
  case "$1" in
    operator) echo operator/Dockerfile ;;
    trainer) echo trainer_image/Dockerfile ;;
    engine) echo trainer_image/engine.Dockerfile ;;
  esac
}

# pip's configuration on this machine, as build arguments (and mounts of the local paths it names).
pip_args=()
pip_config="$($PYTHON -m pip config list 2>/dev/null || true)"
pip_value() { sed -n "s/^[a-z]*\.$1='\(.*\)'\$/\1/p" <<<"$pip_config" | tail -1; }
declare -A mounts=()
for key in index-url extra-index-url find-links; do
  value="$(pip_value "$key")"
  [[ -n "$value" ]] || continue
  keep=()
  for item in $value; do
    path="${item#file://}"
    if [[ "$path" == /* ]]; then
      [[ "$tool" != docker && -e "$path" ]] || continue  # docker build cannot mount a host path
      top="/$(cut -d/ -f2-3 <<<"$path")"  # e.g. /opt/pypi for /opt/pypi/simple
      mounts["$top"]=1
    fi
    keep+=("$item")
  done
  [[ ${#keep[@]} -gt 0 ]] || continue
  env_name="PIP_$(tr 'a-z-' 'A-Z_' <<<"$key")"
  pip_args+=(--build-arg "$env_name=${keep[*]}")
done
mount_args=()
for top in "${!mounts[@]}"; do mount_args+=(--volume "$top:$top:ro"); done
# The CA bundle pip trusts here (a proxy's own CA, say): the build's pip trusts the same.
cert="$(pip_value cert)"
if [[ -n "$cert" && -f "$cert" && "$tool" != docker ]]; then
  mount_args+=(--volume "$cert:/run/dtrain-build/ca.pem:ro")
  pip_args+=(--build-arg PIP_CERT=/run/dtrain-build/ca.pem)
fi

# What goes into an image's dtrain wheel, the paths its .dockerignore lets into the build context:
# a layer that installs the wheel from a mounted stage is rebuilt when this changes.
source_digest() {
  local paths
  mapfile -t paths < <(sed -n 's|^!\(.*[^/]\)/*$|\1|p' "$1.dockerignore")
  find "${paths[@]}" -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

build_one() {
  local name="$1" file base tag
  file="$(dockerfile "$name")"
  tag="$REGISTRY/dtrain-$name:$VERSION"
  local args=(-f "$file" -t "$tag" "${pip_args[@]}")
  case "$name" in
    operator) base="${OPERATOR_BASE:-}" ;;
    trainer) base="${TRAINER_BASE:-}" ;;
    engine) base="${ENGINE_BASE:-}"
      args+=(--build-arg "DTRAIN_EXTRA=${ENGINE_EXTRA:-tensorrt}" --build-arg "REQUIRE_TENSORRT=${REQUIRE_TENSORRT:-1}") ;;
  esac
  [[ -z "$base" ]] || args+=(--build-arg "BASE_IMAGE=$base")
  args+=(--build-arg "DTRAIN_SOURCE_DIGEST=$(source_digest "$file")")
  [[ "$name" == operator || -z "${TORCH_PACKAGES:-}" ]] || args+=(--build-arg "TORCH_PACKAGES=$TORCH_PACKAGES")
  echo "build-images: $tool: $tag from $file${base:+ on $base}"
  case "$tool" in
    docker) DOCKER_BUILDKIT=1 nice -n 10 docker build "${args[@]}" . ;;
    podman) nice -n 10 podman build --layers --ignorefile "$file.dockerignore" "${mount_args[@]}" "${args[@]}" . ;;
    buildah) nice -n 10 buildah build --isolation "${BUILDAH_ISOLATION:-chroot}" --layers \
      --ignorefile "$file.dockerignore" "${mount_args[@]}" "${args[@]}" . ;;
  esac
}

for name in "${names[@]}"; do
  tag="$REGISTRY/dtrain-$name:$VERSION"
  if [[ "$PUSH" == 1 ]]; then
    echo "build-images: pushing $tag"
    "$tool" push "$tag"
  else
    build_one "$name"
  fi
done

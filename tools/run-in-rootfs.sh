#!/usr/bin/env bash
# Run a command inside an image's root filesystem as a given user, the way a container runtime
# would start the image's entrypoint (needs root; no container runtime): a private mount
# namespace, the root filesystem bind-mounted (read-only with --read-only, as the chart runs the
# operator), fresh /proc, a minimal /dev, a tmpfs /tmp, the host's network.
#
#   tools/run-in-rootfs.sh [--read-only] [--bind HOST:GUEST]... [--env NAME=VALUE]... [--workdir DIR] \
#       ROOTFS UID[:GID] -- COMMAND [ARG...]
#
# The environment inside is only what --env gives (pass the image's own ENV too).
set -euo pipefail

read_only=0
binds=()
envs=()
workdir=/
while [[ $# -gt 0 ]]; do
  case "$1" in
    --read-only) read_only=1; shift ;;
    --bind) binds+=("$2"); shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -ge 4 && "$3" == "--" ]] || { echo "usage: $0 [options] ROOTFS UID[:GID] -- COMMAND..." >&2; exit 2; }
rootfs="$1" user="$2"
shift 3
[[ "$user" == *:* ]] || user="$user:$user"

export RIR_ROOTFS="$rootfs" RIR_USER="$user" RIR_READ_ONLY="$read_only" RIR_WORKDIR="$workdir"
export RIR_BINDS="$(printf '%s\n' "${binds[@]+"${binds[@]}"}")"
export RIR_ENVS="$(printf '%s\n' "${envs[@]+"${envs[@]}"}")"
exec unshare --mount --propagation private --fork -- bash -euo pipefail -c '
  new="$(mktemp -d /tmp/rootfs.XXXXXX)"
  mount --bind "$RIR_ROOTFS" "$new"
  while IFS= read -r bind; do
    [[ -n "$bind" ]] || continue
    host="${bind%%:*}" guest="${bind#*:}"
    mkdir -p "$new$guest"
    mount --bind "$host" "$new$guest"
  done <<<"$RIR_BINDS"
  mount -t proc proc "$new/proc"
  mount -t tmpfs -o mode=755 tmpfs "$new/dev"
  for node in "null c 1 3" "zero c 1 5" "full c 1 7" "random c 1 8" "urandom c 1 9" "tty c 5 0"; do
    read -r dev kind major minor <<<"$node"
    mknod -m 666 "$new/dev/$dev" "$kind" "$major" "$minor"
  done
  mkdir -p "$new/dev/shm" "$new/dev/pts"
  mount -t tmpfs -o mode=1777 tmpfs "$new/dev/shm"
  ln -s /proc/self/fd "$new/dev/fd"
  mkdir -p "$new/tmp"
  mount -t tmpfs -o mode=1777 tmpfs "$new/tmp"
  mkdir -p "$new$RIR_WORKDIR"  # as a container runtime does for a WORKDIR the image does not hold
  if [[ "$RIR_READ_ONLY" == 1 ]]; then
    mount -o remount,bind,ro "$new"
  fi
  mapfile -t envs <<<"$RIR_ENVS"
  filtered=()
  for e in "${envs[@]}"; do [[ -n "$e" ]] && filtered+=("$e"); done
  exec chroot --userspec="$RIR_USER" --groups="${RIR_USER#*:}" "$new" \
    /usr/bin/env -i "${filtered[@]}" /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$RIR_WORKDIR" "$@"
' run-in-rootfs "$@"

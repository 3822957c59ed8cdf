#!/usr/bin/env bash
# Install what `make e2e` needs from Debian's packages: ip (iproute2) for network namespaces,
# veth pairs and the bridge, tc (iproute2) for a slowed link (netem); unshare, mount and umount
# (util-linux, mount) for each pod's PID, mount and UTS namespaces; openssl for the test API server's certificate. Nothing is done when
# every command is already there. Needs root (the e2e itself does too).
set -euo pipefail

declare -A PACKAGE=([ip]=iproute2 [tc]=iproute2 [unshare]=util-linux [mount]=mount [umount]=mount [openssl]=openssl [pkill]=procps)
missing=()
for command in "${!PACKAGE[@]}"; do
  command -v "$command" >/dev/null 2>&1 || missing+=("${PACKAGE[$command]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
  echo "install-e2e-deps: missing ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-e2e-deps: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)

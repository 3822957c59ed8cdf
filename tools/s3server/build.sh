#!/usr/bin/env bash
# Build the tests' S3 server (the Versity S3 Gateway, pinned in go.mod and go.sum) into
# .tools/bin/versitygw.
# Go's module and build caches are reused, so only the first build is slow (see docs/storage.md
# for how long a cold one takes). The binary is rebuilt when go.mod or go.sum is newer than it.
#   bash tools/s3server/build.sh [OUT]        (default: .tools/bin/versitygw at the repository root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/.tools/bin/versitygw}"
if [[ -x "$out" && "$out" -nt "$here/go.mod" && "$out" -nt "$here/go.sum" ]]; then
    exit 0
fi
command -v go >/dev/null || { echo "tools/s3server/build.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cd "$here"
start=$SECONDS
# -mod=readonly: go.mod and go.sum are the pin; a build never changes them. Niced: it takes both cores.
nice -n 10 go build -mod=readonly -trimpath -ldflags='-s -w' -o "$out.tmp" github.com/versity/versitygw/cmd/versitygw
mv "$out.tmp" "$out"
echo "built $out in $(( SECONDS - start )) s"

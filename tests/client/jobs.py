"""The job files the client tests submit."""

from __future__ import annotations

import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cluster_quickstart() -> Path:
    """examples/quickstart.yaml as the README's cluster walkthrough makes it: with shared storage, which a cluster
    asks of a two-node job with the engine step (docs/storage.md)."""
    path = Path(tempfile.mkdtemp(prefix="dtrain-client-tests-")) / "quickstart.yaml"
    path.write_text((ROOT / "examples" / "quickstart.yaml").read_text() + "  storage:\n    claimName: quickstart-workspace\n")
    return path

"""The end-to-end scenarios on the real control plane (`make cluster`): see __main__.py.

tools/cluster holds the cluster's own package (localcluster): the scenarios use its layout,
certificates and processes, as `make cluster` does.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "cluster"))

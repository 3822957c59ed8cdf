"""End to end: the operator, a local kubelet over the test API server, and worker pods that really train."""

"""The operator: kopf watches, the reconciler and its work queue, the Kubernetes client, metrics and the status it writes."""

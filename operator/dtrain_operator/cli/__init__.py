"""The `dtrain` command: run, validate, the operator, build-engine, and the cluster verbs (submit, get, watch, logs, delete)."""

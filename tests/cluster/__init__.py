"""The end-to-end scenarios on the real control plane (`make cluster`): see __main__.py."""

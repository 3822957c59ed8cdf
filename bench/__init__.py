"""Benchmarks that measure dtrain's overheads against raw PyTorch and the minimum API work.

Run each as a module from the repository root, e.g. `python -m bench.inference`;
see bench/README.md.
"""

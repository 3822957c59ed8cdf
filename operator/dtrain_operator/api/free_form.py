"""Caps on the free-form parts of a spec (`initArgs`, pass-through Kubernetes objects).

Their contents are not typed, so nothing else bounds them: a 300-level `initArgs`
validates and then breaks every place that serialises the job (the status patch, the
worker pods). The walk is iterative, so checking a hostile value cannot itself recurse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# Deeper than any constructor argument or Kubernetes object needs.
MAX_DEPTH = 32
# Values (scalars, lists and maps) in one free-form field.
MAX_VALUES = 10_000
# Characters in one string (a path, a URL, a small inline config).
MAX_STRING_LENGTH = 32 * 1024


def check_free_form(value: Any) -> Any:
    """`value` unchanged, or ValueError naming the first limit it breaks and the way out."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ValueError(f"holds more than {MAX_VALUES} values; pass large settings as a file on a volume")
        if depth > MAX_DEPTH:
            raise ValueError(f"is nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and len(item) > MAX_STRING_LENGTH:
            raise ValueError(f"holds a string of {len(item)} characters (at most {MAX_STRING_LENGTH})")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError("holds infinity or NaN, which JSON (and so the API server) cannot carry")
    return value


def credential_paths(value: Any, is_credential_name: Callable[[str], bool], holds_credential: Callable[[str], bool]) -> list[str]:
    """Dotted paths in `value` of what looks like a credential: a value under a key that names one
    (`hf_token`), or a string that holds one (`Bearer ...`, `https://user:password@...`)."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                if is_credential_name(str(key)) and not isinstance(child, (dict, list)):
                    found.append(child_path)
                else:
                    stack.append((child, child_path))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str) and holds_credential(item):
            found.append(path)
    return sorted(found)

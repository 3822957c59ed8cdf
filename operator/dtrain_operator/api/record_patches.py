"""How the status patches of rank 0's records (api.records.status_patch) add up, and what a write of them must
clear: the report endpoint merges a request's records, the operator merges what arrives between two writes
(controller/report_writes.py), and each write nulls the keys of the maps a record replaces whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The status fields records write: each at most this many bytes of JSON, checked by the endpoint before it writes
# one and by the operator when it reads the status (a field over it is read as absent).
MAX_TRAINER_FIELD_BYTES = 16384
TRAINER_FIELDS = ("progress", "preflight", "lastCheckpoint", "hangStacks")

def merge_patches(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """Two status patches of records as one, as if written in turn: each field's keys merged, the later's winning
    (so a later record's map, its metrics say, replaces the earlier's)."""
    merged = dict(earlier)
    for field, value in later.items():
        before = merged.get(field)
        merged[field] = {**before, **value} if isinstance(before, Mapping) and isinstance(value, Mapping) else value
    return merged


# Maps a record replaces whole in the status: a merge patch would keep every key ever sent (a metric logged once,
# a version), so the keys the new map lacks are nulled (`replacing_maps`).
REPLACED_MAPS = (("progress", "metrics"), ("preflight", "versions"))


def with_records(status: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`status` as it reads once `patch` (records not written yet) is: the patch applied as a merge patch, the
    maps a record replaces replaced (`replacing_maps`)."""
    return _applied(status, replacing_maps(patch, status))


def _applied(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) applied: maps merged, a null removes its key."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            before = result.get(key)
            result[key] = _applied(before if isinstance(before, Mapping) else {}, value)
        else:
            result[key] = value
    return result


def replacing_maps(patch: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` (a merge patch of the status) with a null for each key of REPLACED_MAPS that `status` holds and the
    patch's map of that name lacks."""
    replaced = dict(patch)
    for field, name in REPLACED_MAPS:
        new, old = replaced.get(field), status.get(field)
        if not isinstance(new, Mapping) or name not in new or not isinstance(old, Mapping):
            continue
        before, after = old.get(name), new.get(name)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            replaced[field] = {**new, name: {**{key: None for key in before if key not in after}, **after}}
    return replaced

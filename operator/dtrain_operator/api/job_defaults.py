"""Job defaults: what a platform team sets once at install (the chart's `jobDefaults`) for every field a job
leaves unset: storage, images, the engine's fallback and resources, NCCL, scheduling.

A job's own fields always win. Objects merge key by key, except those that are one choice as a whole
(WHOLE_FIELDS: storage, a class with its arguments, resources, affinity, a node selector): a job that sets
one replaces the default's whole, as it does any list or value. `namespaces` holds per-namespace defaults,
laid over `spec`. The operator fills a job before it validates and accepts it, so `status.acceptedSpec`
shows what the job runs with; `dtrain validate --defaults FILE` fills it the same way. The file is read
and checked by api.validation.parse_job_defaults.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WHOLE_FIELDS = frozenset({"storage", "model", "data", "initArgs", "resources", "affinity", "nodeSelector"})


class JobDefaultsError(ValueError):
    """Job defaults that cannot be used, with the field and the fix."""


def with_defaults(spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with every field it leaves unset (absent or null) taken from `defaults`."""
    merged = copy.deepcopy(dict(defaults))
    for key, value in spec.items():
        default = defaults.get(key)
        if value is None and default is not None:
            continue
        if isinstance(value, Mapping) and isinstance(default, Mapping) and key not in WHOLE_FIELDS:
            merged[key] = with_defaults(value, default)
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True)
class JobDefaults:
    """The defaults of every namespace (`spec`) and of some (`namespaces`, laid over `spec`)."""

    spec: Mapping[str, Any] = field(default_factory=dict)
    namespaces: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_namespace(self, namespace: str) -> dict[str, Any]:
        return with_defaults(self.namespaces.get(namespace) or {}, self.spec)

    def fill(self, document: Any, namespace: str = "default") -> Any:
        """A job object with its spec's unset fields filled, as the operator fills it in its namespace (its own,
        else `namespace`, as `kubectl apply -n` gives it); no change when there is no spec mapping to fill."""
        if not isinstance(document, Mapping) or not isinstance(document.get("spec"), Mapping):
            return document
        metadata = document.get("metadata")
        own = metadata.get("namespace") if isinstance(metadata, Mapping) else None
        return {**document, "spec": with_defaults(document["spec"], self.for_namespace(str(own or namespace)))}

"""The operator tests' API server's record of resource requests (apiserver.py), as RBAC sees them: for
comparing the operator's calls with its RBAC rules."""

from __future__ import annotations

import dataclasses

from .kmock_adapter import Request


@dataclasses.dataclass(frozen=True)
class Call:
    """One resource request, as RBAC sees it."""

    verb: str
    api_group: str
    resource: str
    subresource: str = ""

    @property
    def rbac_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def rbac_verb(request: Request) -> str:
    method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
    if method == "GET":
        if request.params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if request.name else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(
        method, "delete" if request.name else "deletecollection"
    )

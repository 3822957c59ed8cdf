"""The CRD judged by kube-apiserver itself (tests/control_plane.py): its structural schema, defaults and CEL
rules, on create and on update (oldSelf), by server-side dry run, as `kubectl apply --dry-run=server` asks.

A refused object raises `Refused` with the server's status: 400 BadRequest for an unknown field under strict
field validation, 422 Invalid otherwise, with the causes the server names:

    DistributedTraining.dtrain.dev "job" is invalid: spec.engine: Invalid value: "object": need minBatch <= ...
"""

from __future__ import annotations

import copy
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from dtrain_operator.api import contract, crd
from tests.control_plane import ControlPlane

CRD_ESTABLISHED_SECONDS = 30.0
SERVER_SET_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


@dataclass(frozen=True)
class Cause:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class Refused(Exception):
    """The API server's refusal of a request: its HTTP status, reason, message and causes."""

    def __init__(self, status: int, reason: str, message: str, causes: list[Cause]) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.causes = causes


class KubeAdmission:
    """Create and update of DistributedTrainings, answered by kube-apiserver; the CRD installed once."""

    def __init__(self, plane: ControlPlane) -> None:
        self.url = plane.url
        self.context = ssl.create_default_context(cafile=plane.ca)
        self.context.load_cert_chain(plane.admin_cert, plane.admin_key)
        self.namespaces = {"default"}
        self.install(crd.crd())  # or found installed already (tests/control_plane.py's with_crd)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                query: dict[str, str] | None = None, user: str | None = None) -> dict[str, Any]:
        """One request as the admin, or as `user` (impersonated: what that user's RBAC allows)."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", **({"Impersonate-User": user} if user else {})}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            status = json.loads(error.read() or b"{}")
            causes = [Cause(c.get("field", ""), c.get("message", "")) for c in (status.get("details") or {}).get("causes", [])]
            raise Refused(error.code, status.get("reason", ""), status.get("message", str(error)), causes) from None

    def install(self, definition: dict[str, Any], dry_run: bool = False) -> None:
        """The CRD created (or, dry, only judged: its rules compiled and their cost estimated), and Established."""
        query = {"dryRun": "All"} if dry_run else None
        try:
            self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", definition, query)
        except Refused as refused:
            if dry_run or refused.status != 409:
                raise
        if dry_run:
            return
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{definition['metadata']['name']}"
        deadline = time.monotonic() + CRD_ESTABLISHED_SECONDS
        while not any(c["type"] == "Established" and c["status"] == "True"
                      for c in self.request("GET", path).get("status", {}).get("conditions") or []):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the CRD was not Established within {CRD_ESTABLISHED_SECONDS:.0f} s")
            time.sleep(0.1)

    def namespace(self, name: str) -> str:
        """The namespace, created the first time it is asked for."""
        if name not in self.namespaces:
            self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            self.namespaces.add(name)
        return name

    def _collection(self, obj: dict[str, Any]) -> str:
        namespace = self.namespace((obj.get("metadata") or {}).get("namespace") or "default")
        return f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL}"

    def check(self, obj: dict[str, Any], old: dict[str, Any] | None = None,
              field_validation: str = "Strict", user: str | None = None) -> dict[str, Any]:
        """The object as the server would store it, or Refused. With `old`, an update of `old` (stored for
        the check, deleted after). `field_validation` as the request's parameter: Strict (kubectl apply's)
        refuses unknown fields, Ignore drops them. `user`: whose create it is (the admin's by default)."""
        query = {"dryRun": "All", "fieldValidation": field_validation}
        collection = self._collection(obj)
        if old is None:
            return self.request("POST", collection, obj, query, user)
        stored = self.request("POST", collection, _fresh(old))
        path = f"{collection}/{stored['metadata']['name']}"
        try:
            new = _fresh(obj)
            new["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            return self.request("PUT", path, new, query)
        finally:
            self.request("DELETE", path)

    def causes(self, obj: dict[str, Any]) -> list[str]:
        """What the server says against creating the object (its schema's and its rules' causes): [] when it
        would store it."""
        try:
            self.check(obj)
        except Refused as refused:
            return [str(c) for c in refused.causes] or [str(refused)]
        return []


def _fresh(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what the server sets at create (a stored object's, as a dry run returns it)."""
    new = copy.deepcopy(obj)
    for key in SERVER_SET_METADATA:
        new.get("metadata", {}).pop(key, None)
    return new

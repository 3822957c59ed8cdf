"""RBAC for the test API server: bearer tokens to users, and every request checked against the
Roles, ClusterRoles and bindings of the rendered Helm chart, as the API server's RBAC authorizer does.

Plugged into `ApiServer(authorizer=...)`; without one the server allows everything (the operator
tests that do not need RBAC). What it does:

- authentication: `Authorization: Bearer <token>`; a token this module issued names a user
  (a service account, with the groups Kubernetes gives one, or an admin in `system:masters`);
  no token or an unknown one is 401;
- authorization: the verb (get, list, watch, create, patch, update, delete, deletecollection),
  API group, resource (`pods`, `distributedtrainings/status`), namespace and name of the request
  against every rule bound to the user: ClusterRoleBindings everywhere, RoleBindings in their
  namespace (to a Role there or to a ClusterRole); `*` and `resourceNames` as RBAC reads them;
  a request no rule allows is 403 with the API server's message;
- discovery and other non-resource paths (`/api`, `/apis`, `/version`) are open to every
  authenticated user, as the default `system:discovery` ClusterRole makes them.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable
from typing import Any

from .apiserver import rbac_verb
from .kmock_adapter import KubernetesError, Request

MASTERS = "system:masters"


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        return cls(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        )


@dataclasses.dataclass(frozen=True)
class Attributes:
    """What RBAC decides on (the API server's authorizer.Attributes)."""

    verb: str
    api_group: str
    resource: str  # with the subresource: "distributedtrainings/status"
    namespace: str | None
    name: str | None

    def describe(self) -> str:
        resource, _, subresource = self.resource.partition("/")
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        sub = f'/{subresource}' if subresource else ""
        return f'cannot {self.verb} resource "{resource}{sub}" in API group "{self.api_group}" {where}'


def _matches(values: Iterable[str], wanted: str) -> bool:
    values = list(values)
    return "*" in values or wanted in values


def rule_allows(rule: dict[str, Any], attributes: Attributes) -> bool:
    if "nonResourceURLs" in rule and "resources" not in rule:
        return False
    if not _matches(rule.get("verbs", []), attributes.verb):
        return False
    if not _matches(rule.get("apiGroups", []), attributes.api_group):
        return False
    resources = rule.get("resources", [])
    _, _, subresource = attributes.resource.partition("/")
    if not (_matches(resources, attributes.resource) or (subresource and f"*/{subresource}" in resources)):
        return False
    names = rule.get("resourceNames")
    if names:
        return attributes.name is not None and attributes.name in names
    return True


class Authorizer:
    """Tokens to users, and the chart's RBAC objects deciding what each user may do."""

    def __init__(self, rbac_objects: Iterable[dict[str, Any]]) -> None:
        self.roles: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.tokens: dict[str, User] = {}
        # Every decision on a resource request, by user name: what ran, and what was refused.
        self.allowed_requests: list[tuple[str, Attributes]] = []
        self.denied: list[tuple[str, Attributes]] = []
        for obj in rbac_objects:
            kind = obj.get("kind")
            meta = obj.get("metadata") or {}
            if kind == "ClusterRole":
                self.roles[None, meta["name"]] = list(obj.get("rules") or [])
            elif kind == "Role":
                self.roles[meta["namespace"], meta["name"]] = list(obj.get("rules") or [])
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                self.bindings.append(obj)

    # --- Authentication ---------------------------------------------------------------------------

    def issue(self, user: User) -> str:
        """A new bearer token for `user` (a service account's token, or an admin's)."""
        token = f"{user.name.replace(':', '.')}.{secrets.token_hex(16)}"
        self.tokens[token] = user
        return token

    def admin_token(self, name: str = "e2e-admin") -> str:
        return self.issue(User(name, (MASTERS, "system:authenticated")))

    def authenticate(self, request: Request) -> User:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        user = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise KubernetesError(401, "Unauthorized", "Unauthorized")
        return user

    # --- Authorization ----------------------------------------------------------------------------

    def _subject_is(self, subject: dict[str, Any], user: User, binding_namespace: str | None) -> bool:
        kind = subject.get("kind")
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or binding_namespace
            return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
        if kind == "User":
            return user.name == subject.get("name")
        if kind == "Group":
            return subject.get("name") in user.groups
        return False

    def rules_for(self, user: User, namespace: str | None) -> list[dict[str, Any]]:
        """Every rule that applies to `user` for a request in `namespace` (None: cluster-scoped)."""
        rules: list[dict[str, Any]] = []
        for binding in self.bindings:
            meta = binding.get("metadata") or {}
            binding_namespace = meta.get("namespace") if binding["kind"] == "RoleBinding" else None
            if binding_namespace is not None and binding_namespace != namespace:
                continue
            if not any(self._subject_is(s, user, binding_namespace) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                rules.extend(self.roles.get((None, ref.get("name")), []))
            else:
                rules.extend(self.roles.get((binding_namespace, ref.get("name")), []))
        return rules

    def allowed(self, user: User, attributes: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        return any(rule_allows(rule, attributes) for rule in self.rules_for(user, attributes.namespace))

    def authorize(self, request: Request) -> None:
        """Raise the API server's 401 or 403 for a request it would refuse; return for one it allows."""
        user = self.authenticate(request)
        resource = request.resource
        if resource is None or not resource.plural or request.action is None:
            return  # discovery and other non-resource paths: every authenticated user
        plural = resource.plural + (f"/{request.subresource}" if request.subresource else "")
        attributes = Attributes(rbac_verb(request), resource.group or "", plural, request.namespace, request.name)
        if not self.allowed(user, attributes):
            self.denied.append((user.name, attributes))
            raise KubernetesError(403, "Forbidden", f'{plural} is forbidden: User "{user.name}" {attributes.describe()}')
        self.allowed_requests.append((user.name, attributes))

"""The key that signs the operator's record of each job (trusted.py).

It lives in a Secret in the operator's own namespace, which only the operator's service account
may read (the chart's Role names it). The first replica to start creates it with 32 random bytes;
every replica, and every restart, reads the same key, so records outlive the operator's pods.
Users who may edit DistributedTrainings cannot read it, so they cannot sign a record.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from dtrain_operator.controller.kube import ApiError, KubeClient

DEFAULT_SECRET = "dtrain-operator-state-key"
KEY_FIELD = "key"
KEY_BYTES = 32


class RecordKeyError(Exception):
    """The key cannot be read or created: the operator cannot sign or check a record."""


def _key_of(secret: dict[str, object], where: str) -> bytes:
    data = secret.get("data")
    encoded = data.get(KEY_FIELD) if isinstance(data, dict) else None
    try:
        key = base64.b64decode(str(encoded), validate=True) if encoded else b""
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < KEY_BYTES:
        raise RecordKeyError(
            f"the Secret {where} has no usable data.{KEY_FIELD} (at least {KEY_BYTES} bytes, base64); "
            "delete it and the operator creates a new one"
        )
    return key


async def load_record_key(client: KubeClient, namespace: str, name: str = DEFAULT_SECRET) -> bytes:
    """The operator's signing key: read from its Secret, or created there by the first replica."""
    where = f"{namespace}/{name}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "dtrain-operator"}},
        "type": "Opaque",
        "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()},
    }
    try:
        try:
            return _key_of(await client.get("v1", "Secret", namespace, name), where)
        except ApiError as exc:
            if not exc.not_found:
                raise
        # Two replicas may both find it missing: the second create meets 409 and reads the first's.
        stored, _ = await client.create_or_read(secret)
        return _key_of(stored, where)
    except ApiError as exc:
        raise RecordKeyError(
            f"cannot read or create the Secret {where} that holds the key of the operator's records "
            f"({exc.status} {exc.reason}: {exc.message}); the chart's Role grants get on it and create on Secrets "
            "in the operator's namespace"
        ) from exc

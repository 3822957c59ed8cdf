"""The certificate of the operator's report endpoint (report_server.py).

A certificate authority of the operator's own and a serving certificate signed by it for the
report Service's DNS names, kept in a Secret of the operator's namespace that only its service
account reads (the chart's Role names it). The first replica to start creates it; every replica
and every restart serves the same certificate, so a failover changes nothing for the trainers.
The CA's certificate (never its key, which is not kept) reaches rank 0 in its job's ConfigMap.

Both live ten years and are not rotated: delete the Secret and restart the operator to get new
ones (jobs created before keep the CA of their ConfigMap until they finish).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dtrain_operator.controller.kube import ApiError, KubeClient

CA_FIELD = "ca.crt"
CERT_FIELD = "tls.crt"
KEY_FIELD = "tls.key"
VALIDITY = datetime.timedelta(days=3650)


class ReportTLSError(Exception):
    """The report endpoint's certificate cannot be read or created."""


@dataclass(frozen=True)
class ReportTLS:
    ca_pem: str
    cert_pem: str
    key_pem: str

    def server_context(self) -> ssl.SSLContext:
        """An SSL context that serves the certificate (the key touches disk only in a private directory, briefly)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="dtrain-report-tls-") as directory:
            cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
            cert.write_text(self.cert_pem)
            descriptor = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(self.key_pem)
            context.load_cert_chain(cert, key)
        return context

    def names(self) -> list[str]:
        certificate = x509.load_pem_x509_certificate(self.cert_pem.encode())
        return certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )


def service_names(service: str, namespace: str) -> list[str]:
    """The names a pod may use for the Service, as cluster DNS answers them."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}"]


def _pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def issue(names: list[str], now: datetime.datetime | None = None) -> ReportTLS:
    """A new CA and a serving certificate for `names`, signed by it (ECDSA P-256)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + VALIDITY
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dtrain-operator report CA")])
    ca_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(ca_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_id), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return ReportTLS(_pem(ca), _pem(certificate), key_pem)


def _decoded(secret: dict[str, object], where: str) -> ReportTLS:
    data = secret.get("data")
    fields = {}
    for field in (CA_FIELD, CERT_FIELD, KEY_FIELD):
        encoded = data.get(field) if isinstance(data, dict) else None
        try:
            fields[field] = base64.b64decode(str(encoded), validate=True).decode() if encoded else ""
        except (binascii.Error, ValueError):
            fields[field] = ""
        if not fields[field]:
            raise ReportTLSError(
                f"the Secret {where} has no usable data.{field}; delete it and the operator creates a new one"
            )
    return ReportTLS(fields[CA_FIELD], fields[CERT_FIELD], fields[KEY_FIELD])


async def load_report_tls(client: KubeClient, namespace: str, name: str, service: str) -> ReportTLS:
    """The report endpoint's certificate: read from its Secret, or issued and stored there by the first replica."""
    where = f"{namespace}/{name}"
    names = service_names(service, namespace)
    try:
        try:
            tls = _decoded(await client.get("v1", "Secret", namespace, name), where)
        except ApiError as exc:
            if not exc.not_found:
                raise
            issued = issue(names)
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "dtrain-operator"}},
                "type": "kubernetes.io/tls",
                "data": {
                    field: base64.b64encode(value.encode()).decode()
                    for field, value in ((CA_FIELD, issued.ca_pem), (CERT_FIELD, issued.cert_pem), (KEY_FIELD, issued.key_pem))
                },
            }
            # Two replicas may both find it missing: the second create meets 409 and reads the first's.
            stored, _ = await client.create_or_read(secret)
            tls = _decoded(stored, where)
    except ApiError as exc:
        raise ReportTLSError(
            f"cannot read or create the Secret {where} that holds the report endpoint's certificate "
            f"({exc.status} {exc.reason}: {exc.message}); the chart's Role grants get on it and create on Secrets "
            "in the operator's namespace"
        ) from exc
    try:
        covered = tls.names()
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise ReportTLSError(f"the Secret {where} holds no readable certificate ({exc}); delete it") from exc
    if names[0] not in covered:
        raise ReportTLSError(
            f"the certificate in the Secret {where} is for {', '.join(covered)}, not the report Service "
            f"{names[0]}; delete the Secret and the operator issues one for it"
        )
    return tls

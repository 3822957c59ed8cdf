"""The certificate of the operator's report endpoint (report_server.py).

A certificate authority of the operator's own, kept in a Secret of the operator's namespace that only its
service account reads (the chart's Role names it), and short-lived serving certificates it signs. The first
replica to start creates the CA; every replica issues its own serving certificate for the report Service's
DNS names, in memory (valid SERVING_VALIDITY, renewed at two thirds of it while the replica runs: the server's
SSL context loads the new one, the connections open keep theirs). The serving key is never written anywhere:
it reaches OpenSSL through an in-memory file. The CA's certificate (never its key) reaches every worker pod in an
annotation of its own (core.render.trainer_files), so a renewed serving certificate or a failover changes nothing
for the trainers.

The CA lives ten years: delete the Secret and restart the operator to get a new one (pods created before keep
the CA they were created with, and cannot report until their gang is restarted in new pods).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dtrain_operator.controller.kube import ApiError, KubeClient

CA_FIELD = "ca.crt"
CA_KEY_FIELD = "ca.key"
CA_VALIDITY = datetime.timedelta(days=3650)
SERVING_VALIDITY = datetime.timedelta(hours=24)
RENEW_SECONDS = SERVING_VALIDITY.total_seconds() * 2 / 3
"""A serving certificate is renewed at two thirds of its life."""
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dtrain-operator report CA")])


class ReportTLSError(Exception):
    """The report endpoint's certificate cannot be read or created."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class ReportTLS:
    """The CA, and the report Service's names its serving certificates are for."""

    ca_pem: str
    ca_key_pem: str
    names: tuple[str, ...]

    def serving_certificate(self, now: datetime.datetime | None = None) -> tuple[str, str]:
        """A new serving certificate for `names`, signed by the CA, and its key (PEM; ECDSA P-256)."""
        now = now or _now()
        ca_key = serialization.load_pem_private_key(self.ca_key_pem.encode(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        ca_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.names[0])]))
            .issuer_name(CA_NAME)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + SERVING_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in self.names]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_id), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return _pem(certificate), key_pem

    def server_context(self) -> ssl.SSLContext:
        """An SSL context that serves a new serving certificate (renew() loads the next one into it)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.renew(context)
        return context

    def renew(self, context: ssl.SSLContext, now: datetime.datetime | None = None) -> float:
        """Load a new serving certificate into `context` (new connections get it); returns the seconds until the
        next renewal (two thirds of its life)."""
        cert_pem, key_pem = self.serving_certificate(now)
        _load_chain(context, cert_pem + key_pem)
        return RENEW_SECONDS


def _load_chain(context: ssl.SSLContext, pem: str) -> None:
    """The certificate and its key into `context` through an in-memory file (Linux), so that the key touches no
    disk; elsewhere (a developer's machine) a private temporary file, removed at once."""
    if hasattr(os, "memfd_create"):
        descriptor = os.memfd_create("dtrain-report-tls", os.MFD_CLOEXEC)
        try:
            os.write(descriptor, pem.encode())
            context.load_cert_chain(f"/proc/self/fd/{descriptor}")
        finally:
            os.close(descriptor)
        return
    with tempfile.TemporaryDirectory(prefix="dtrain-report-tls-") as directory:
        path = os.path.join(directory, "tls.pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(pem)
        context.load_cert_chain(path)


def service_names(service: str, namespace: str) -> list[str]:
    """The names a pod may use for the Service, as cluster DNS answers them."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}"]


def _pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def issue(names: list[str], now: datetime.datetime | None = None) -> ReportTLS:
    """A new CA (ECDSA P-256), for serving certificates for `names`."""
    now = now or _now()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(CA_NAME)
        .issuer_name(CA_NAME)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_key_pem = ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()
    return ReportTLS(_pem(ca), ca_key_pem, tuple(names))


def _decoded(secret: dict[str, object], where: str, names: list[str]) -> ReportTLS:
    data = secret.get("data")
    fields = {}
    for field in (CA_FIELD, CA_KEY_FIELD):
        encoded = data.get(field) if isinstance(data, dict) else None
        try:
            fields[field] = base64.b64decode(str(encoded), validate=True).decode() if encoded else ""
        except (binascii.Error, ValueError):
            fields[field] = ""
        if not fields[field]:
            raise ReportTLSError(
                f"the Secret {where} has no usable data.{field} (one from an earlier operator holds a serving "
                "certificate instead); delete it and the operator creates a new one"
            )
    return ReportTLS(fields[CA_FIELD], fields[CA_KEY_FIELD], tuple(names))


async def load_report_tls(client: KubeClient, namespace: str, name: str, service: str) -> ReportTLS:
    """The report endpoint's CA: read from its Secret, or made and stored there by the first replica."""
    where = f"{namespace}/{name}"
    names = service_names(service, namespace)
    try:
        try:
            tls = _decoded(await client.get("v1", "Secret", namespace, name), where, names)
        except ApiError as exc:
            if not exc.not_found:
                raise
            issued = issue(names)
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "dtrain-operator"}},
                "type": "Opaque",
                "data": {
                    field: base64.b64encode(value.encode()).decode()
                    for field, value in ((CA_FIELD, issued.ca_pem), (CA_KEY_FIELD, issued.ca_key_pem))
                },
            }
            # Two replicas may both find it missing: the second create meets 409 and reads the first's.
            stored, _ = await client.create_or_read(secret)
            tls = _decoded(stored, where, names)
    except ApiError as exc:
        raise ReportTLSError(
            f"cannot read or create the Secret {where} that holds the report endpoint's certificate "
            f"({exc.status} {exc.reason}: {exc.message}); the chart's Role grants get on it and create on Secrets "
            "in the operator's namespace"
        ) from exc
    try:
        tls.serving_certificate()
    except (ValueError, TypeError, AssertionError) as exc:
        raise ReportTLSError(f"the Secret {where} holds no usable CA ({exc}); delete it") from exc
    return tls

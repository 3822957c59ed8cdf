"""The test API server's TLS: a throwaway CA and a serving certificate for the node's address, made
with the `openssl` command, so that the in-cluster client (which speaks only HTTPS and checks the
server against the mounted ca.crt) works unchanged."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {result.stderr.strip()}")


class Certificates:
    def __init__(self, folder: Path, address: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = folder / "ca.crt"
        self.cert = folder / "apiserver.crt"
        self.key = folder / "apiserver.key"
        ca_key = folder / "ca.key"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dtrain-e2e-ca",
                 "-keyout", str(ca_key), "-out", str(self.ca))
        csr = folder / "apiserver.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                 "-keyout", str(self.key), "-out", str(csr))
        ext = folder / "san.ext"
        ext.write_text(
            f"subjectAltName=IP:{address},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\n"
        )
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-days", "2", "-extfile", str(ext), "-out", str(self.cert))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

"""The cluster's certificates and keys, made with `openssl` as kubeadm's `certs` phase makes them:
one CA; the API server's serving certificate (its bridge address, 127.0.0.1, the `kubernetes`
Service's ClusterIP and names); client certificates whose subject is the identity RBAC sees
(`CN=<user>, O=<group>`): the admin (system:masters), the controller manager, the scheduler,
each node (`system:node:<name>` in `system:nodes`), the API server's client for kubelets; each
kubelet's serving certificate; and the service-account signing key pair.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import layout

DAYS = "365"


class PkiError(RuntimeError):
    pass


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise PkiError(f"openssl {args[0]}: {result.stderr.strip()}")


def ca() -> tuple[Path, Path]:
    return layout.PKI / "ca.crt", layout.PKI / "ca.key"


def _certificate(name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    """A key and a certificate signed by the CA, made once (kept across `up`s of the same cluster)."""
    cert, key = layout.PKI / f"{name}.crt", layout.PKI / f"{name}.key"
    if cert.exists() and key.exists():
        return cert, key
    ca_cert, ca_key = ca()
    csr, ext = layout.PKI / f"{name}.csr", layout.PKI / f"{name}.ext"
    ext.write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", DAYS, "-extfile", str(ext), "-out", str(cert))
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)
    return cert, key


def client(name: str, user: str, group: str | None = None) -> tuple[Path, Path]:
    subject = f"/CN={user}" + (f"/O={group}" if group else "")
    return _certificate(name, subject, "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment")


def serving(name: str, common_name: str, addresses: list[str], dns_names: list[str] = ()) -> tuple[Path, Path]:
    names = [f"IP:{a}" for a in addresses] + [f"DNS:{d}" for d in dns_names]
    return _certificate(
        name, f"/CN={common_name}",
        f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment",
    )


def make_all(nodes: list[layout.Node]) -> None:
    """Everything `up` needs: the cluster's own (make_cluster), then each node's (make_node)."""
    make_cluster()
    for node in nodes:
        make_node(node)


def make_cluster() -> None:
    """The CA, the service-account key pair, the API server's serving certificate and the control
    plane's and admin's client certificates."""
    layout.PKI.mkdir(parents=True, exist_ok=True)
    layout.PKI.chmod(0o700)
    ca_cert, ca_key = ca()
    if not ca_cert.exists():
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", "/CN=dtrain-local-cluster-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-keyout", str(ca_key), "-out", str(ca_cert))
    service_key = layout.PKI / "service-account.key"
    if not service_key.exists():
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(service_key))
        _openssl("pkey", "-in", str(service_key), "-pubout", "-out", str(layout.PKI / "service-account.pub"))
    serving("apiserver", "kube-apiserver", [layout.BRIDGE_ADDRESS, "127.0.0.1", layout.KUBERNETES_SERVICE_IP], [
        "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
        f"kubernetes.default.svc.{layout.CLUSTER_DOMAIN}",
    ])
    client("admin", "kubernetes-admin", "system:masters")
    client("controller-manager", "system:kube-controller-manager")
    client("scheduler", "system:kube-scheduler")
    client("apiserver-kubelet-client", "kube-apiserver-kubelet-client")


def make_node(node: layout.Node) -> None:
    """One node's client certificate (system:node:<name> in system:nodes) and its kubelet's serving
    certificate, signed by the cluster's CA: all that a node joining a running cluster needs."""
    if not all(path.exists() for path in ca()):
        raise PkiError(f"the cluster's CA is not in {layout.PKI}: make cluster starts a cluster first")
    client(f"{node.name}-client", f"system:node:{node.name}", "system:nodes")
    serving(f"{node.name}-serving", f"system:node:{node.name}", [layout.BRIDGE_ADDRESS, "127.0.0.1"], [node.name])


def kubeconfig(path: Path, user: str, cert: Path, key: Path, server: str = layout.APISERVER_URL) -> Path:
    """A kubeconfig with a client certificate, as kubeadm writes admin.conf and the components' files."""
    ca_cert, _ = ca()
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: dtrain-local
  cluster:
    server: {server}
    certificate-authority: {ca_cert}
users:
- name: {user}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: {user}@dtrain-local
  context: {{cluster: dtrain-local, user: {user}}}
current-context: {user}@dtrain-local
""")
    path.chmod(0o600)
    return path

"""HTTPS to the operator's report endpoint, as every sender in a worker pod reaches it.

Every operator replica stands behind the report Service's name (headless: one address each); only the
leader answers and a standby says 503, so a request tries each address in turn and keeps to the one that
answered last. Each request carries the pod's projected service-account token for the operator's audience
(re-read every time: the kubelet rotates it) and checks the operator's certificate, by the Service's name,
against the CA the operator put in the pod (contract.OPERATOR_CA_PATH).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_common.errors import ConfigError
from dtrain_operator.api import contract

MAX_ANSWER_BYTES = 65536


def describe_failure(exc: BaseException) -> str:
    """A short, secret-free description of why a request failed."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


@dataclass(frozen=True)
class Answer:
    status: int
    body: str


@dataclass
class OperatorLink:
    """The operator's report Service at `url` (https://<service>.<namespace>.svc:<port>)."""

    url: str
    token_path: Path = Path(contract.OPERATOR_TOKEN_PATH)
    ca_path: Path = Path(contract.OPERATOR_CA_PATH)
    resolve: Callable[[str, int], list[str]] | None = None
    host: str = field(init=False)
    port: int = field(init=False)
    _preferred: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme != "https" or not parsed.hostname:
            raise ConfigError(f"{contract.ENV_OPERATOR_URL} is {self.url!r}: give https://<host>:<port>")
        self.host = parsed.hostname
        self.port = parsed.port or contract.DEFAULT_REPORT_PORT

    def post(self, path: str, body: bytes, timeout: float, final: Container[int] = ()) -> Answer | str:
        """POST a JSON body to the replica that answers: its answer (a status under 300, or one of `final`),
        else why none did."""
        try:
            token = self.token_path.read_text().strip()
            context = ssl.create_default_context(cafile=str(self.ca_path))
            addresses = (self.resolve or addresses_of)(self.host, self.port)
        except (OSError, ssl.SSLError) as exc:
            return describe_failure(exc)
        if self._preferred in addresses:
            addresses.remove(self._preferred)
            addresses.insert(0, self._preferred)
        problems = []
        for address in addresses:
            connection = _AddressedHTTPSConnection(address, self.host, self.port, context, timeout)
            try:
                connection.request(
                    "POST", path, body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                )
                response = connection.getresponse()
                text = response.read(MAX_ANSWER_BYTES).decode(errors="replace").strip()
            except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
                problems.append(f"{address}: {describe_failure(exc)}")
                continue
            finally:
                connection.close()
            if response.status < 300 or response.status in final:
                self._preferred = address
                return Answer(response.status, text)
            problems.append(f"{address}: {response.status} {text[:200]}")
        return "; ".join(problems) or f"{self.host} has no address"


def addresses_of(host: str, port: int) -> list[str]:
    """Every address of a name (a headless Service: one per operator replica)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


class _AddressedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to one address of a name, checking the certificate against the name (not the address)."""

    def __init__(self, address: str, host: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]

"""The report endpoint's bounds against the jobs' own code, which runs in the worker pods that reach it.

Whatever a pod does, the operator's memory and its other jobs' reports stay unaffected:
- connections: at most MAX_CONNECTIONS in all and MAX_CONNECTIONS_PER_PEER from one address (a pod);
  one over is closed at once (`AdmittedProtocol`);
- time: a TLS handshake (and the TLS close a peer is waited for) has HANDSHAKE_SECONDS, an idle keep-alive
  connection IDLE_SECONDS;
- requests: each address has a token bucket (PEER_RATE a second, PEER_BURST at once), taken before the
  TokenReview, so that a flood of made-up tokens costs the API server no more than the bucket allows;
- TokenReviews in flight: at most MAX_PENDING_REVIEWS; more answer 503 at once instead of queueing.
An honest job holds one long-poll connection per worker pod (its supervisor) and one more on rank 0 (its
records), and reports every few seconds. An idle TLS connection costs about 280 KiB (asyncio's read buffer is 256
KiB of it), so MAX_CONNECTIONS keeps them near 210 MiB at worst, under the chart's 512 MiB limit
(bench/report_flood.py measures it).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

MAX_CONNECTIONS = 768
MAX_CONNECTIONS_PER_PEER = 8
HANDSHAKE_SECONDS = 5.0
IDLE_SECONDS = 20.0
PEER_RATE = 5.0
PEER_BURST = 20.0
MAX_PEERS_TRACKED = 8192
MAX_PENDING_REVIEWS = 64


@dataclass(frozen=True)
class ServingLimits:
    """The endpoint's bounds (the module's defaults; tests give smaller ones)."""

    connections: int = MAX_CONNECTIONS
    connections_per_peer: int = MAX_CONNECTIONS_PER_PEER
    handshake_seconds: float = HANDSHAKE_SECONDS
    idle_seconds: float = IDLE_SECONDS
    peer_rate: float = PEER_RATE
    peer_burst: float = PEER_BURST


@dataclass
class ConnectionLimits:
    """Open connections, in all and by peer address."""

    total: int = MAX_CONNECTIONS
    per_peer: int = MAX_CONNECTIONS_PER_PEER
    open: Counter[str] = field(default_factory=Counter)
    refused: int = 0

    def admit(self, peer: str) -> bool:
        if sum(self.open.values()) >= self.total or self.open[peer] >= self.per_peer:
            self.refused += 1
            return False
        self.open[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]


class AdmittedProtocol(asyncio.Protocol):
    """aiohttp's request handler behind `limits`: a connection over them is closed before it reaches it."""

    def __init__(self, inner: asyncio.Protocol, limits: ConnectionLimits) -> None:
        self._inner = inner
        self._limits = limits
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        if not self._limits.admit(peer):
            cast(asyncio.Transport, transport).abort()
            return
        self._peer = peer
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is None:
            return
        self._limits.release(self._peer)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


@dataclass
class PeerRateLimiter:
    """A token bucket per peer address; the least recently seen are forgotten past MAX_PEERS_TRACKED."""

    rate: float = PEER_RATE
    burst: float = PEER_BURST
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    """peer -> (tokens, when they were counted)."""

    def allow(self, peer: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        tokens, then = self.buckets.pop(peer, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[peer] = (tokens - 1.0 if allowed else tokens, now)  # re-inserted: the newest last
        while len(self.buckets) > MAX_PEERS_TRACKED:
            del self.buckets[next(iter(self.buckets))]
        return allowed


def peer_of(request: Any) -> str:
    """The address a request came from (aiohttp's `remote`)."""
    return str(getattr(request, "remote", None) or "?")

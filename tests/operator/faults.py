"""Fault injection for the operator tests' API server (apiserver.py): requests answered with an error or
held at a gate, watch streams dropped or stalled, and the 429 that says when to retry."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import attrs

from .kmock_adapter import KubernetesError, Request


class Gate:
    """Holds matching requests until released; counts those waiting."""

    def __init__(self, matches: Callable[[Request], bool], after: int = 0) -> None:
        self.matches = matches
        self.passed = 0
        self.after = after
        self.held = 0
        self._open = asyncio.Event()
        self._fail = False

    async def wait(self, request: Request) -> None:
        if self._open.is_set():
            return  # released: later requests pass
        if self.passed < self.after:
            self.passed += 1
            return
        self.held += 1
        await self._open.wait()
        if self._fail:
            raise KubernetesError(503, "ServiceUnavailable", "the gate failed this request")

    def release(self, fail: bool = False) -> None:
        """Let the held requests through (`fail`: answer them with 503 instead, as if never processed).
        Requests that come after the release pass."""
        self._fail = fail
        self._open.set()


@attrs.frozen
class Throttled(KubernetesError):
    """An error the client is told to retry after `retry_after` seconds (the Retry-After header)."""

    retry_after: int = 1


@dataclasses.dataclass
class _Failure:
    matches: Callable[[Request], bool]
    status: int
    reason: str
    times: int | None
    until: float | None
    retry_after: int | None = None


class Faults:
    """Failures to inject: errors, gates, dropped and stalled watches."""

    def __init__(self) -> None:
        self._failures: list[_Failure] = []
        self.gates: list[Gate] = []
        self.stalled_until = 0.0
        self.drops = 0
        self.failed = 0

    def fail(
        self,
        matches: Callable[[Request], bool],
        status: int = 500,
        reason: str = "InternalError",
        times: int | None = None,
        seconds: float | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer matching requests with `status`, `times` times or for `seconds` (or until cleared);
        with `retry_after`, the answer says when to retry (429 TooManyRequests, say)."""
        until = asyncio.get_running_loop().time() + seconds if seconds is not None else None
        self._failures.append(_Failure(matches, status, reason, times, until, retry_after))

    def gate(self, matches: Callable[[Request], bool], after: int = 0) -> Gate:
        """Hold matching requests (after letting `after` of them through) until the gate is released."""
        gate = Gate(matches, after)
        self.gates.append(gate)
        return gate

    def stall_watches(self, seconds: float) -> None:
        """Keep watch streams open but silent for a while, as a connection that died without closing."""
        self.stalled_until = asyncio.get_running_loop().time() + seconds

    def drop_watches(self) -> None:
        """Close every open watch stream now (clients reconnect)."""
        self.drops += 1

    def clear(self) -> None:
        self._failures.clear()
        for gate in self.gates:
            gate.release()
        self.gates.clear()

    @property
    def stalled(self) -> bool:
        return asyncio.get_running_loop().time() < self.stalled_until

    async def intercept(self, request: Request) -> None:
        now = asyncio.get_running_loop().time()
        for failure in list(self._failures):
            if failure.until is not None and now > failure.until or failure.times == 0:
                self._failures.remove(failure)
                continue
            if failure.matches(request):
                if failure.times is not None:
                    failure.times -= 1
                self.failed += 1
                if failure.retry_after is not None:
                    raise Throttled(
                        failure.status, failure.reason, f"injected fault ({failure.status}): try again later",
                        {"retryAfterSeconds": failure.retry_after}, retry_after=failure.retry_after,
                    )
                raise KubernetesError(failure.status, failure.reason, f"injected fault ({failure.status})")
        for gate in list(self.gates):
            if gate.matches(request):
                await gate.wait(request)

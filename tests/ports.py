"""A TCP port for a server a test or benchmark starts: one below the kernel's ephemeral range.

bind(0) hands out a port from the range the kernel also takes outgoing connections' source ports from, so
between that pick and the server's own bind any client connection on the machine may take it: CI saw an
operator under test fail so ("address already in use"), beside tests connecting to API servers. A port
below that range is taken only by a bind that names it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below: ports of well-known services
ATTEMPTS = 200

_handed_out: set[int] = set()  # never the same port twice to one process's servers


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port no socket holds now, on any address (servers here bind 0.0.0.0 or 127.0.0.1)."""
    choices = random.SystemRandom()
    high = _ephemeral_low()
    for _ in range(ATTEMPTS):
        port = choices.randrange(LOWEST_PORT, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {LOWEST_PORT} and {high} after {ATTEMPTS} tries")

"""Free TCP ports for the servers tests and benches start, chosen where no one else takes them.

A port from binding port 0 comes out of the kernel's ephemeral range (32768-60999 by
default), the range every outgoing connection and every other port-0 bind draws from too:
between the moment it is chosen and the moment the server binds it, any of the parallel
tests' connections may take it (node 0's TCPStore failed with ``EADDRINUSE`` so in a
README run). Ports drawn at random below that range, and above Ray's worker ports
(10002-19999), are taken by no one who did not choose them; each is checked free when
chosen. Where the machine's ephemeral range leaves no room below it, port 0 is used.
"""

from __future__ import annotations

import random
import socket

#: The range drawn from: above Ray's worker ports, below the usual ephemeral range.
LOW, HIGH = 20000, 32768
#: Where Linux says its ephemeral range lies.
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` now (held open together while chosen)."""
    high = min(HIGH, _ephemeral_low())
    draw = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for _ in range(100 * n):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, draw.randrange(LOW, high) if high - LOW >= 1000 else 0))
            except OSError:  # taken: draw again
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise OSError(f"found only {len(socks)} of {n} free ports on {host}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (`free_ports`)."""
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    try:
        with open(_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return HIGH

"""`unstall.testing.ports`: ports the tests' servers bind, drawn where the kernel's own are not."""

from __future__ import annotations

import socket

from unstall.testing import ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range():
    low = ports._ephemeral_low()
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8
    for port in chosen:
        assert ports.LOW <= port < min(ports.HIGH, low)
        with socket.socket() as s:  # free: a server can bind it
            s.bind(("127.0.0.1", port))


def test_a_port_taken_is_never_chosen(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, taken, *(p for p in range(20000, 20200) if p != taken)])
        monkeypatch.setattr(ports, "LOW", 1024)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        assert ports.free_ports(1) != [taken]


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1024)
    port = ports.free_port("127.0.0.2")
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.2", port))

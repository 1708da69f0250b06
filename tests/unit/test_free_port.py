"""The tests' port picker: ports the kernel never hands out by itself, never the same twice."""

from __future__ import annotations

import itertools
import socket

import pytest

from tests.fixtures import frontend_harness
from tests.fixtures.frontend_harness import free_port


def test_picked_ports_are_bindable_distinct_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if frontend_harness._EPHEMERAL_LOW > frontend_harness._PORT_LOW + 1000:
        assert all(frontend_harness._PORT_LOW <= p < frontend_harness._EPHEMERAL_LOW for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        start = (port - frontend_harness._PORT_LOW) % frontend_harness._SPAN
        monkeypatch.setattr(frontend_harness, "_next_port", itertools.count(start))
        if frontend_harness._EPHEMERAL_LOW > frontend_harness._PORT_LOW + 1000:
            assert free_port() != port

"""The core's Channel: while the loop is busy, its keep-alive thread says Busy to the frontends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from enginecore.channel import Channel
from shared.protocol import Busy, Heartbeat, Stats, encoder, frontend_decoder

KEEPALIVE_S = 0.05


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[tuple[Channel, zmq.Socket[bytes]]]:
    address = f"ipc://{tmp_path}/core.sock"
    channel = Channel(address, keepalive_s=KEEPALIVE_S)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"fe-1")
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    dealer.send(encoder().encode(Heartbeat()))
    assert [client for client, _ in channel.recv_all(5000)] == [b"fe-1"]
    try:
        yield channel, dealer
    finally:
        dealer.close()
        ctx.term()
        channel.close()


def received(dealer: zmq.Socket[bytes], seconds: float) -> list[object]:
    decoder = frontend_decoder()
    out: list[object] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if dealer.poll(int(left * 1000) + 1, zmq.POLLIN):
            out.append(decoder.decode(dealer.recv()))
    return out


def test_a_long_busy_stretch_says_busy_and_a_short_one_or_idleness_does_not(
    linked: tuple[Channel, zmq.Socket[bytes]],
) -> None:
    channel, dealer = linked
    with channel.busy([b"fe-1"]):
        time.sleep(KEEPALIVE_S / 4)  # shorter than one keep-alive: nothing to say
    assert received(dealer, 6 * KEEPALIVE_S) == []  # idle: the loop answers for itself

    with channel.busy([b"fe-1"]):
        time.sleep(8 * KEEPALIVE_S)
        channel.send(b"fe-1", Stats())  # the loop's own sends go out meanwhile
    said = received(dealer, 4 * KEEPALIVE_S)
    busy = [m for m in said if isinstance(m, Busy)]
    assert len(busy) >= 3, said
    assert all(b.seconds >= KEEPALIVE_S for b in busy)
    assert [b.seconds for b in busy] == sorted(b.seconds for b in busy)
    assert sum(isinstance(m, Stats) for m in said) == 1
    assert received(dealer, 4 * KEEPALIVE_S) == []  # not busy any more


def test_close_stops_the_keep_alive_thread(tmp_path: Path) -> None:
    channel = Channel(f"ipc://{tmp_path}/core.sock", keepalive_s=KEEPALIVE_S)
    keeper = channel._keeper
    assert keeper is not None
    assert keeper.is_alive()
    with channel.busy([b"nobody"]):
        channel.close()  # mid-step (a drained core exits from its loop)
    assert not keeper.is_alive()

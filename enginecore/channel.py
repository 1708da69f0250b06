"""Channel: the core's one ROUTER socket and its msgspec codec; the only zmq user in the core."""

from __future__ import annotations

import logging

import msgspec
import zmq

from shared.protocol import ToCore, ToFrontend, core_decoder, encoder

log = logging.getLogger(__name__)


class Channel:
    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished frontend's frames are dropped
        self.sock.bind(address)
        self.encoder = encoder()
        self.decoder = core_decoder()

    def recv_all(self, timeout_ms: int) -> list[tuple[bytes, ToCore]]:
        """Every pending message; waits up to timeout_ms for the first one (0 = do not wait)."""
        out: list[tuple[bytes, ToCore]] = []
        if not self.sock.poll(timeout_ms, zmq.POLLIN):
            return out
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            if len(frames) != 2:
                log.warning("dropped a message of %d frames", len(frames))
                continue
            try:
                out.append((frames[0], self.decoder.decode(frames[1])))
            except msgspec.DecodeError as e:
                log.warning("dropped an undecodable message from %r: %s", frames[0], e)

    def send(self, client: bytes, msg: ToFrontend) -> None:
        try:
            self.sock.send_multipart([client, self.encoder.encode(msg)], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("frontend %r is not reading; dropped a %s", client, type(msg).__name__)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()

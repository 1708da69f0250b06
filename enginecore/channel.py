"""Channel: the core's one ROUTER socket and its msgspec codec; the only zmq user in the core.

The link's policy is shared/core_link.py's: an ipc socket in this user's private directory,
taken over from a dead predecessor but never from a live core, and removed when the channel
closes; a tcp socket with CURVE (pyzmq's ZAP authenticator admits only the frontends whose
public certificates are in curve_authorized_keys), or on loopback only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

import msgspec
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from shared.core_link import NO_KEYS, CurveKeys, check_protected, ensure_private_dir, ipc_path
from shared.protocol import ToCore, ToFrontend, core_decoder, encoder

log = logging.getLogger(__name__)
_ZAP_DOMAIN = "tl-serve"  # the authenticator answers for this socket's domain


class Channel:
    def __init__(self, address: str, keys: CurveKeys = NO_KEYS) -> None:
        check_protected(address, keys, "core")
        self.ctx = zmq.Context()
        self.auth: ThreadAuthenticator | None = None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished frontend's frames are dropped
        self.socket_file = ipc_path(address)
        self._socket_inode = 0
        try:
            if keys.enabled:
                self._secure(keys)
            if self.socket_file is not None:
                _claim(self.socket_file)
            self.sock.bind(address)
        except (zmq.ZMQError, OSError, ValueError) as e:
            self.close()
            raise ValueError(f"cannot serve {address}: {e}") from e
        if self.socket_file is not None:
            self._socket_inode = self.socket_file.stat().st_ino
        self.encoder = encoder()
        self.decoder = core_decoder()

    def _secure(self, keys: CurveKeys) -> None:
        """CURVE server: our key pair, and a ZAP handler admitting the authorized keys only."""
        public, secret = zmq.auth.load_certificate(keys.core)
        if secret is None:
            raise ValueError(f"curve_core_key {keys.core} holds no secret key")
        authorized = Path(keys.authorized)
        if not keys.authorized or not any(authorized.glob("*.key")):
            raise ValueError(
                f"curve_authorized_keys {keys.authorized!r} holds no frontend certificate (*.key)"
            )
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        self.auth.configure_curve(domain=_ZAP_DOMAIN, location=str(authorized))
        self.sock.setsockopt(zmq.CURVE_SERVER, 1)
        self.sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        self.sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        self.sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())

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
        """Close the socket, stop the authenticator and remove our ipc socket file."""
        self.sock.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
        path = self.socket_file
        if path is not None and self._socket_inode:
            # only the file we bound: a successor may have taken the path since
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_ino == self._socket_inode:
                    path.unlink()


def _claim(path: Path) -> None:
    """Make way for our ipc socket at `path`: refuse if a live core serves it, remove a file
    left by a dead one (ZeroMQ would silently take the path over from a live one too)."""
    ensure_private_dir(path.parent)
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:  # nobody listens: refused, or not a socket at all
        log.info("removing a stale socket file %s", path)
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise ValueError(f"another process serves {path}")

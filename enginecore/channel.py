"""Channel: the core's one ROUTER socket and its msgspec codec; the only zmq user in the core.

The link's policy is shared/core_link.py's: an ipc socket in this user's private directory,
taken over from a dead predecessor but never from a live core, and removed when the channel
closes; a tcp socket with CURVE (pyzmq's ZAP authenticator admits only the frontends whose
public certificates are in curve_authorized_keys), or on loopback only.

The core reads its socket only between steps, and a step can outlast a frontend's patience (a
512-token prefill of a 1.7B model takes over 10 s on two cores). So while the loop is busy, a
keep-alive thread tells each frontend so (Busy, every `keepalive_s`); the kernels release the
GIL. A lock makes the socket the thread's or the loop's, never both at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from shared.core_link import NO_KEYS, CurveKeys, check_protected, ensure_private_dir, ipc_path
from shared.protocol import Busy, ToCore, ToFrontend, core_decoder, encoder

log = logging.getLogger(__name__)
_ZAP_DOMAIN = "tl-serve"  # the authenticator answers for this socket's domain


class Channel:
    def __init__(self, address: str, keys: CurveKeys = NO_KEYS, keepalive_s: float = 1.0) -> None:
        check_protected(address, keys, "core")
        self.lock = threading.Lock()  # the socket is used by the loop and the keep-alive thread
        self.keepalive_s = keepalive_s
        self._busy_since: float | None = None  # None: the loop is reading, not busy
        self._busy_peers: tuple[bytes, ...] = ()
        self._closed = threading.Event()
        self._keeper: threading.Thread | None = None
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
        self._keeper = threading.Thread(target=self._keep_alive, name="keepalive", daemon=True)
        self._keeper.start()

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
        with self.lock:
            if not self.sock.poll(timeout_ms, zmq.POLLIN):
                return out
            batch = []
            while True:
                try:
                    batch.append(self.sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        for frames in batch:
            if len(frames) != 2:
                log.warning("dropped a message of %d frames", len(frames))
                continue
            try:
                out.append((frames[0], self.decoder.decode(frames[1])))
            except msgspec.DecodeError as e:
                log.warning("dropped an undecodable message from %r: %s", frames[0], e)
        return out

    def send(self, client: bytes, msg: ToFrontend) -> None:
        data = self.encoder.encode(msg)
        with self.lock:
            try:
                self.sock.send_multipart([client, data], zmq.NOBLOCK)
            except zmq.Again:
                log.warning("frontend %r is not reading; dropped a %s", client, type(msg).__name__)

    @contextlib.contextmanager
    def busy(self, peers: Iterable[bytes]) -> Iterator[None]:
        """The loop is working and not reading: `peers` hear Busy every keepalive_s meanwhile."""
        self._busy_peers = tuple(peers)
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = None

    def _keep_alive(self) -> None:
        encode = encoder().encode  # the loop's encoder is the loop's
        while not self._closed.wait(self.keepalive_s):
            since, peers = self._busy_since, self._busy_peers
            if since is None or not peers:
                continue
            seconds = time.monotonic() - since
            if seconds < self.keepalive_s:
                continue
            data = encode(Busy(round(seconds, 3)))
            with self.lock:
                if self._closed.is_set():
                    return
                for peer in peers:
                    with contextlib.suppress(zmq.Again):
                        self.sock.send_multipart([peer, data], zmq.NOBLOCK)

    def close(self) -> None:
        """Stop the keep-alive thread, close the socket, stop the authenticator and remove our
        ipc socket file."""
        self._closed.set()
        if self._keeper is not None:
            self._keeper.join()
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

"""Where the core link lives and what protects it: addresses, the private ipc directory, CURVE.

Policy only (no zmq here): the core's Channel and the frontend's CoreClient apply it with
pyzmq's own CURVE security. An ipc socket lives in a directory only this user can enter. A
tcp address that is not loopback must be protected by CURVE: a core refuses to bind one
without its key pair and an allow-list of frontend keys, and a frontend refuses to attach to
one without the core's public key.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import tempfile
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit


class CurveKeys(NamedTuple):
    """Certificate files in pyzmq's zmq.auth format (see `python -m frontend.core.keys`)."""

    core: str  # the core's certificate: its secret one on the core, the public one on frontends
    frontend: str  # this frontend's secret certificate
    authorized: str  # directory of the public certificates of the frontends the core admits

    @property
    def enabled(self) -> bool:
        return bool(self.core)


NO_KEYS = CurveKeys("", "", "")


def runtime_dir() -> Path:
    """The directory of this user's ipc sockets (created by whoever binds first)."""
    return Path(tempfile.gettempdir()) / f"tl-serve-{os.getuid()}"


def ensure_private_dir(path: Path) -> None:
    """Create `path` mode 0700, or check that an existing one is ours and closed to others."""
    path.mkdir(mode=0o700, parents=False, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ValueError(f"{path} is not a directory of this user: refusing to use its sockets")
    if info.st_mode & 0o077:
        raise ValueError(f"{path} is open to other users (mode {info.st_mode & 0o777:o})")


def ipc_path(address: str) -> Path | None:
    """The socket file of an ipc:// address, None for any other transport."""
    return Path(address[len("ipc://") :]) if address.startswith("ipc://") else None


def is_loopback_tcp(address: str) -> bool:
    """tcp://127.x.x.x:port, tcp://[::1]:port or tcp://localhost:port."""
    if not address.startswith("tcp://"):
        return False
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, or a wildcard such as *: not provably loopback


def check_protected(address: str, keys: CurveKeys, side: str) -> None:
    """Refuse a tcp address reachable from other hosts unless CURVE keys protect it."""
    if address.startswith("tcp://") and not is_loopback_tcp(address) and not keys.enabled:
        what = (
            "curve_core_key (the core's secret certificate) and curve_authorized_keys"
            if side == "core"
            else "curve_core_key (the core's public certificate) and curve_frontend_key"
        )
        raise ValueError(
            f"core_address {address} is reachable from other hosts: the core link must be "
            f"protected with CURVE keys ({what}); see `python -m frontend.core.keys`"
        )

"""The core link's policy: loopback, the private ipc directory, who must hold CURVE keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontend.core.client import CoreClient
from shared.core_link import (
    NO_KEYS,
    CurveKeys,
    check_protected,
    ensure_private_dir,
    is_loopback_tcp,
)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.2.1:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.7:5555", False),
        ("tcp://core.default.svc:5555", False),
        ("ipc:///tmp/x.sock", False),
    ],
)
def test_loopback(address: str, loopback: bool) -> None:
    assert is_loopback_tcp(address) is loopback


def test_a_reachable_tcp_address_needs_keys_on_both_sides() -> None:
    for side in ("core", "frontend"):
        check_protected("tcp://127.0.0.1:5555", NO_KEYS, side)
        check_protected("ipc:///tmp/x.sock", NO_KEYS, side)
        check_protected("tcp://0.0.0.0:5555", CurveKeys("core.key", "fe.key_secret", "d"), side)
        with pytest.raises(ValueError, match="reachable from other hosts"):
            check_protected("tcp://0.0.0.0:5555", NO_KEYS, side)


def test_a_frontend_refuses_to_attach_to_a_reachable_core_without_its_key() -> None:
    with pytest.raises(ValueError, match="curve_core_key"):
        CoreClient("tcp://10.1.2.3:5555")


def test_the_ipc_directory_is_private(tmp_path: Path) -> None:
    d = tmp_path / "run"
    ensure_private_dir(d)
    assert d.stat().st_mode & 0o777 == 0o700
    ensure_private_dir(d)  # ours already: fine
    d.chmod(0o755)
    with pytest.raises(ValueError, match="open to other users"):
        ensure_private_dir(d)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises((ValueError, FileExistsError)):
        ensure_private_dir(f)

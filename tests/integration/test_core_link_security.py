"""The core link as a door, with real processes: CURVE keys, who may stop the core, and the
ipc socket file on every exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from frontend.core import keys as keytool
from frontend.core.client import curve_options
from shared.core_link import CurveKeys
from shared.protocol import Hello, ShutdownCore, Submit, encoder
from tests.conftest import TinyModels
from tests.fixtures.engine_cores import BASE, client_of, greedy, text
from tests.fixtures.live_server import (
    LiveServer,
    default_engine,
    free_port,
    live_server,
    post,
    run_frontend,
)
from tests.fixtures.processes import SpawnedCore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """core, an authorized frontend `fe`, and `stranger`, whose key the core does not list."""
    d = tmp_path_factory.mktemp("certs")
    keytool.main([str(d), "core", "fe", "stranger"])
    (d / "authorized").mkdir()
    (d / "authorized" / "fe.key").write_bytes((d / "fe.key").read_bytes())
    return d


def fe_keys(certs: Path, name: str = "fe") -> CurveKeys:
    return CurveKeys(str(certs / "core.key"), str(certs / f"{name}.key_secret"), "")


@pytest.fixture(scope="module")
def curve_core(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels, certs: Path
) -> Iterator[SpawnedCore]:
    settings = {
        "model_dir": str(tiny.gguf_quant),
        **BASE,
        "curve_core_key": str(certs / "core.key_secret"),
        "curve_authorized_keys": str(certs / "authorized"),
    }
    address = f"tcp://127.0.0.1:{free_port()}"
    core = SpawnedCore(
        tmp_path_factory.mktemp("curve"),
        settings,
        curve=curve_options(fe_keys(certs)),
        address=address,
    ).start()
    yield core
    core.stop()


def test_a_frontend_with_the_right_keys_is_served(curve_core: SpawnedCore) -> None:
    c = client_of(curve_core)
    out = c.generate("keyed", text("Hello"), greedy(5))
    assert len(out.token_ids) == 5


@pytest.mark.parametrize("who", ["no keys", "unlisted key"])
def test_a_peer_without_an_authorized_key_gets_nothing_through(
    curve_core: SpawnedCore, certs: Path, who: str
) -> None:
    owner = client_of(curve_core)
    before = owner.stats()
    ctx = zmq.Context()
    intruder = ctx.socket(zmq.DEALER)
    intruder.setsockopt(zmq.LINGER, 0)
    intruder.setsockopt(zmq.SNDTIMEO, 2000)
    for option, value in (
        {} if who == "no keys" else curve_options(fe_keys(certs, "stranger"))
    ).items():
        intruder.setsockopt(option, value)
    intruder.connect(curve_core.address)
    encode = encoder().encode
    sent = 0
    try:
        for msg in (
            Hello("intruder"),
            ShutdownCore(token=""),
            Submit("intruder", text("let me in"), greedy(50, ignore_eos=True)),
        ):
            with contextlib.suppress(zmq.Again):  # no handshake: nowhere to queue it
                intruder.send(encode(msg))
                sent += 1
        assert not intruder.poll(3000, zmq.POLLIN), "the core answered an unauthorized peer"
    finally:
        intruder.close()
        ctx.term()
    after = owner.stats()
    assert after.prefix_cache_queries == before.prefix_cache_queries  # its Submit never ran
    assert (after.active_sequences, after.queue_depth) == (0, 0)
    assert curve_core.proc is not None and curve_core.proc.poll() is None  # no ShutdownCore
    assert "intruder" not in curve_core.log()
    assert len(owner.generate("after", text("Hi"), greedy(3)).token_ids) == 3


def test_a_core_refuses_a_public_tcp_address_without_keys(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    settings = {"model_dir": str(tiny.gguf_quant), **BASE}
    core = SpawnedCore(
        tmp_path_factory.mktemp("open"), settings, address=f"tcp://0.0.0.0:{free_port()}"
    )
    t0 = time.monotonic()
    code, log = core.run_to_exit()
    assert code == 2
    assert "reachable from other hosts" in log and "curve_core_key" in log
    assert time.monotonic() - t0 < 30  # refused before the model is loaded


def test_only_the_spawners_token_stops_the_core(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    core = SpawnedCore(
        tmp_path_factory.mktemp("owned"),
        {"model_dir": str(tiny.gguf_quant), **BASE},
        entry=("-m", "enginecore", "--owner-stdin"),
        stdin=b"s3cret\n",
    ).start()
    try:
        attached = client_of(core)
        attached.send(ShutdownCore(token="guess"))
        attached.send(ShutdownCore(token=""))
        out = attached.generate("still", text("Hi"), greedy(3))  # still serving
        assert len(out.token_ids) == 3
        assert core.proc is not None and core.proc.poll() is None
        attached.send(ShutdownCore(token="s3cret"))
        assert core.wait(30) == 0
        assert "ignored a ShutdownCore" in core.log()
    finally:
        core.stop()


def socket_file(core: SpawnedCore) -> Path:
    return Path(core.address.removeprefix("ipc://"))


def test_the_socket_file_goes_on_sigterm_and_a_stale_one_is_replaced(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    workdir = tmp_path_factory.mktemp("sock")
    settings = {"model_dir": str(tiny.gguf_quant), **BASE}
    core = SpawnedCore(workdir, settings).start()
    path = socket_file(core)
    assert path.exists()
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    core.terminate()
    assert core.wait(30) == 0
    assert not path.exists()  # a clean exit leaves nothing behind
    # SIGKILL leaves the file; the next core takes the path over
    core = SpawnedCore(workdir, settings).start()
    assert core.proc is not None
    os.kill(core.proc.pid, signal.SIGKILL)
    core.wait(30)
    assert path.exists()
    core = SpawnedCore(workdir, settings).start()
    try:
        assert len(client_of(core).generate("again", text("Hi"), greedy(3)).token_ids) == 3
        # a second core on the live path is refused, never a hijack of the first
        second = SpawnedCore(workdir, settings)
        code, log = second.run_to_exit()
        assert code == 2 and "another process serves" in log
        assert len(client_of(core).generate("still", text("Hi"), greedy(3)).token_ids) == 3
    finally:
        core.stop()
    assert not path.exists()


def test_an_ipc_directory_open_to_others_is_refused(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    workdir = tmp_path_factory.mktemp("open-dir")
    shared_dir = workdir / "shared"
    shared_dir.mkdir()
    shared_dir.chmod(0o777)
    settings = {"model_dir": str(tiny.gguf_quant), **BASE}
    core = SpawnedCore(workdir, settings, address=f"ipc://{shared_dir / 'core.sock'}")
    code, log = core.run_to_exit()
    assert code == 2 and "open to other users" in log


def test_a_live_unix_socket_on_the_path_is_never_taken_over(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    workdir = tmp_path_factory.mktemp("taken")
    path = workdir / "core.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    try:
        code, log = SpawnedCore(workdir, {"model_dir": str(tiny.gguf_quant), **BASE}).run_to_exit()
        assert code == 2 and "another process serves" in log
    finally:
        listener.close()


async def test_two_keyed_frontends_share_one_curve_core_over_http(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels, certs: Path
) -> None:
    """A spawns the core (its config holds the core's secret certificate), B attaches with
    only the core's public one; both serve; B leaving does not stop the core."""
    core_address = f"tcp://127.0.0.1:{free_port()}"
    common = {"curve_frontend_key": str(certs / "fe.key_secret")}
    a = default_engine(
        tiny.gguf_quant,
        core_address=core_address,
        curve_core_key=str(certs / "core.key_secret"),
        curve_authorized_keys=str(certs / "authorized"),
        **common,
    )
    b = default_engine(
        tiny.gguf_quant,
        core_address=core_address,
        spawn_core=False,
        curve_core_key=str(certs / "core.key"),
        **common,
    )
    body = {"model": "tiny-q", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    with live_server(tmp_path_factory.mktemp("a"), a) as fa:
        fb = LiveServer(tmp_path_factory.mktemp("b"), b)
        try:
            fb.start()
            for server in (fa, fb):
                reply = await post(server.api + "/v1/completions", body)
                assert reply.status == 200, reply.body
            fb.terminate()
            assert fb.wait() == 0, fb.log()[-3000:]
        finally:
            fb.kill()
        reply = await post(fa.api + "/v1/completions", body)  # B's Bye left the core running
        assert reply.status == 200


def test_a_frontend_without_the_cores_key_refuses_a_reachable_address(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    engine = default_engine(
        tiny.gguf_quant, core_address=f"tcp://10.11.12.13:{free_port()}", spawn_core=False
    )
    code, out = run_frontend(tmp_path_factory.mktemp("open-fe"), engine)
    assert code == 1, out
    assert "reachable from other hosts" in out and "curve_core_key" in out

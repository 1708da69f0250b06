"""Serving as processes: bounded admission, disconnects, drain on SIGTERM,
refusals at start (broken template, bad config) and runtime.toml with TL_ENGINE__ overrides.
Each runs the real `frontend`, which spawns the real engine core, on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frontend.text.chat_template import ChatTemplate, TemplateError
from shared.config import ConfigError, load
from tests.conftest import TinyModels
from tests.fixtures.byte_tokenizer import byte_unicode_chars
from tests.fixtures.live_server import (
    LiveServer,
    default_engine,
    free_port,
    live_server,
    metrics,
    post,
    process_gone,
    request,
    run_frontend,
    wait_metrics,
    write_runtime_toml,
)
from tests.fixtures.vocab_gguf import write_vocab_gguf

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
STEP_DELAY_MS = 40
IDLE = {"tl_engine_active_sequences": 0.0, "tl_engine_kv_blocks{state=used}": 0.0}


def chat(**fields: Any) -> dict[str, Any]:
    base = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    return base | fields


@pytest.fixture(scope="module")
def slow(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One running sequence, a queue of one, and steps slowed down so tests can act mid-way."""
    engine = default_engine(
        tiny.succ, model_id="succ", queue_capacity=1, max_num_seqs=1, step_delay_ms=STEP_DELAY_MS
    )
    with live_server(tmp_path_factory.mktemp("slow"), engine) as server:
        yield server


async def open_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], events: int
) -> tuple[aiohttp.ClientResponse, list[Any]]:
    """A started stream and its first `events` data documents."""
    resp = await session.post(url, json=body | {"stream": True})
    assert resp.status == 200, await resp.text()
    first = [json.loads((await resp.content.readuntil(b"\n\n"))[6:]) for _ in range(events)]
    return resp, first


async def test_full_queue_answers_429_with_retry_after(slow: LiveServer) -> None:
    url = slow.api + CHAT
    async with aiohttp.ClientSession() as session:
        running, _ = await open_stream(session, url, chat(max_tokens=500), 3)  # ~20 s of work
        queued = asyncio.create_task(post(url, chat(max_tokens=3)))
        await wait_metrics(slow.health, {"tl_engine_queue_depth": 1.0}, 10.0)
        for body in (chat(max_tokens=3), chat(max_tokens=3, stream=True)):
            t0 = time.monotonic()
            refused = await post(url, body)
            assert refused.status == 429, refused.body
            assert time.monotonic() - t0 < 5.0  # at once, not after a wait
            # whole seconds from the queue's drain rate since the core started, which the
            # host's speed moves (2 under a cold compile beside): its arithmetic is
            # tests/unit/test_queue_rate.py's
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
            assert refused.doc["error"] == {
                "message": refused.doc["error"]["message"],
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        assert not queued.done()
        # the running client leaves: its abort reaches the scheduler, the queued one runs
        running.close()
        done = await asyncio.wait_for(queued, 8.0)
    assert done.status == 200
    assert done.doc["choices"][0]["message"]["content"] == "bcd"
    assert done.doc["choices"][0]["finish_reason"] == "length"
    await wait_metrics(slow.health, IDLE | {"tl_engine_queue_depth": 0.0}, 5.0)


async def test_disconnect_frees_blocks_within_a_step(slow: LiveServer) -> None:
    url = slow.api + CHAT
    await wait_metrics(slow.health, IDLE, 5.0)
    # a stream, closed by its client mid-way
    async with aiohttp.ClientSession() as session:
        resp, first = await open_stream(session, url, chat(max_tokens=500), 4)
        assert [c["choices"][0]["delta"].get("content") for c in first[1:]] == ["b", "c", "d"]
        busy = await metrics(slow.health)
        assert busy["tl_engine_active_sequences"] == 1
        assert busy["tl_engine_kv_blocks{state=used}"] > 0
        resp.close()
        await wait_metrics(slow.health, IDLE, 2.0)
    # a plain request whose client goes away before the answer
    client = asyncio.create_task(post(url, chat(max_tokens=500)))
    await wait_metrics(slow.health, {"tl_engine_active_sequences": 1.0}, 5.0)
    await asyncio.sleep(0.2)
    client.cancel()  # closes the connection
    await wait_metrics(slow.health, IDLE, 2.0)
    # a request still waiting in the queue (one sequence runs at a time) whose client leaves
    async with aiohttp.ClientSession() as session:
        resp, _ = await open_stream(session, url, chat(max_tokens=500), 2)
        waiting = asyncio.create_task(post(url, chat(max_tokens=3)))
        await wait_metrics(slow.health, {"tl_engine_queue_depth": 1.0}, 5.0)
        waiting.cancel()
        await wait_metrics(slow.health, {"tl_engine_queue_depth": 0.0}, 2.0)
        resp.close()
        await wait_metrics(slow.health, IDLE, 2.0)
    # and the server is still fine
    assert (await post(url, chat(max_tokens=3))).doc["choices"][0]["message"]["content"] == "bcd"


async def test_drain_finishes_in_flight_and_refuses_new(tiny: TinyModels, tmp_path: Path) -> None:
    engine = default_engine(tiny.succ, model_id="succ", step_delay_ms=STEP_DELAY_MS)
    server = LiveServer(tmp_path / "drain", engine).start()
    core = server.core_pid()
    n = 150  # ~6 s of steps: the drain has to wait for them
    body = chat(max_tokens=n, stream_options={"include_usage": True})
    try:
        async with aiohttp.ClientSession() as kept, aiohttp.ClientSession() as streaming:
            # a keep-alive connection and a stream, both opened before the drain
            assert (await kept.get(server.api + "/v1/models")).status == 200
            stream, _ = await open_stream(streaming, server.api + CHAT, body, 2)
            server.terminate()  # SIGTERM
            deadline = time.monotonic() + 5.0
            while (await request("GET", server.health + "/readyz")).status != 503:
                assert time.monotonic() < deadline, "/readyz never turned 503"
                await asyncio.sleep(0.05)
            assert (await request("GET", server.health + "/healthz")).status == 200  # alive
            with pytest.raises(aiohttp.ClientConnectionError):
                await request("GET", server.api + "/v1/models")  # the listener is closed
            async with kept.post(server.api + CHAT, json=chat(max_tokens=2)) as late:
                assert late.status == 503
                assert (await late.json())["error"]["code"] == "shutting_down"
            assert server.proc is not None and server.proc.poll() is None  # still draining
            rest = (await stream.read()).decode()  # the open stream runs to its end
        events = rest.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""], rest[-200:]
        *chunks, usage = [json.loads(e[6:]) for e in events[:-2]]
        assert chunks[0]["choices"][0]["delta"]["content"] == "c"  # "b" came before the drain
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert usage["usage"]["completion_tokens"] == n
        assert server.wait(30.0) == 0
        assert f"engine core (pid {core}) exited with 0" in server.log()
        assert process_gone(core)
    finally:
        server.kill()


BROKEN_TEMPLATES = [
    ("{% for m in messages %}{{ m.content }}", "unclosed block"),
    ("{% frobnicate %}{{ messages }}", "unknown statement"),
    ("{% for m in messages %}{{ m.content|nosuchfilter }}{% endfor %}", "unknown filter"),
]


def test_template_errors_are_caught_at_parse(tiny: TinyModels, tmp_path: Path) -> None:
    ChatTemplate("{% for m in messages %}{{ m.content | upper }}{% endfor %}", "", "")  # fine
    for template, _ in BROKEN_TEMPLATES:
        with pytest.raises(TemplateError):
            ChatTemplate(template, "", "")
    for i, (template, why) in enumerate(BROKEN_TEMPLATES):
        model = tmp_path / f"broken-{i}"
        shutil.copytree(tiny.succ, model)
        config = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(
            json.dumps(config | {"chat_template": template})
        )
        code, output = run_frontend(tmp_path / f"run-{i}", default_engine(model))
        assert code != 0, (why, output)
        assert "chat template" in output, (why, output)
        assert "engine core spawned" not in output  # refused at load, before any core
        assert "Traceback" not in output, output


@pytest.mark.parametrize(
    ("model", "pre", "named"),
    [
        ("gpt2", "deepseek-coder", "tokenizer.ggml.pre = 'deepseek-coder'"),
        ("t5", "default", "tokenizer.ggml.model = 't5'"),
    ],
)
def test_unknown_tokenizer_is_refused_at_start(
    tmp_path: Path, model: str, pre: str, named: str
) -> None:
    tokens = byte_unicode_chars()
    path = write_vocab_gguf(tmp_path / "v.gguf", model, tokens, [1] * 256, pre=pre, merges=[])
    code, output = run_frontend(tmp_path / "run", default_engine(path))
    assert code != 0, output
    assert named in output, output
    assert "engine core spawned" not in output  # refused before any core
    assert "Traceback" not in output, output


# (keys added to the file, environment, what the refusal must name)
REFUSED: list[tuple[dict[str, object], dict[str, str], str]] = [
    ({"bogus_key": 1}, {}, "bogus_key"),
    ({}, {"TL_ENGINE__BOGUS_KNOB": "1"}, "TL_ENGINE__BOGUS_KNOB"),
    ({"prefix_cache": "lru"}, {}, "prefix_cache"),
    ({}, {"TL_ENGINE__QUEUE_CAPACITY": "0"}, "queue_capacity"),
]


def test_runtime_toml_and_env_overrides(tiny: TinyModels, tmp_path: Path) -> None:
    # the file, its defaults and overrides, in process
    path = write_runtime_toml(tmp_path / "runtime.toml", {"model_dir": "m", "queue_capacity": 9})
    config = load(path, {}).engine
    assert (config.model_dir, config.queue_capacity) == ("m", 9)
    assert (config.http_listen, config.health_listen, config.prefix_cache) == (
        ":8000",
        ":9464",
        "radix",
    )
    env = {"TL_ENGINE__QUEUE_CAPACITY": "3", "TL_ENGINE__PREFIX_CACHE": "none"}
    config = load(path, env).engine
    assert (config.queue_capacity, config.prefix_cache) == (3, "none")
    for extra, env, named in REFUSED:
        with pytest.raises(ConfigError, match=named):
            load(write_runtime_toml(tmp_path / "bad.toml", {"model_dir": "m"} | extra), env)
    # the real frontend: overrides beat the file, in both processes
    engine = default_engine(tiny.succ, model_id="succ")
    port = free_port()
    env = {"TL_ENGINE__HTTP_LISTEN": f"127.0.0.1:{port}", "TL_ENGINE__MODEL_ID": "renamed"}
    with live_server(tmp_path / "env", engine, env) as server:
        assert server.api == f"http://127.0.0.1:{port}" != f"http://{engine['http_listen']}"
        models = asyncio.run(request("GET", server.api + "/v1/models")).doc
        assert [m["id"] for m in models["data"]] == ["renamed"]
        reply = asyncio.run(post(server.api + CHAT, chat(model="renamed", max_tokens=2)))
        assert (reply.doc["model"], reply.doc["choices"][0]["message"]["content"]) == (
            "renamed",
            "bc",
        )
        with pytest.raises(aiohttp.ClientConnectionError):
            asyncio.run(request("GET", f"http://{engine['http_listen']}/v1/models"))
    # refusals name the key and exit non-zero, before anything starts
    for i, (extra, env, named) in enumerate(REFUSED):
        code, output = run_frontend(tmp_path / f"bad-{i}", engine | extra, env)
        assert code != 0 and named in output, (named, code, output)
        assert "engine core spawned" not in output

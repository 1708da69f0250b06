"""The official `openai` client against a real frontend and core on the succ model (after byte b
comes byte b + 1), configured with what runtime.toml adds: model aliases, CORS, a chat template
of its own, API keys, usage on every stream, /metrics on the API port. Also vLLM's generation
extras, the probes and tokenizer routes, vLLM's metric names, and X-Request-Id."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import LiveServer, default_engine, live_server, metrics, request

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

KEY = "sk-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://play.example"
ALIAS = "org/succ-alias"
# [role:name]content per message, then the `suffix` a request may pass
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}]"
    "{{ m.content }}{% endfor %}{{ suffix or '' }}"
)
USER: list[Any] = [{"role": "user", "content": "a"}]


@pytest.fixture(scope="module")
def succ(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = default_engine(
        tiny.succ,
        served_model_name=["succ", ALIAS],
        cors_origins=[ORIGIN],
        chat_template=TEMPLATE,
        api_keys=[KEY],
        force_include_usage=True,
        metrics_on_api_port=True,
    )
    with live_server(tmp_path_factory.mktemp("extras"), engine) as server:
        yield server


@pytest.fixture
async def client(succ: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=succ.api + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


async def text_of(client: openai.AsyncOpenAI, stream: bool, **kw: Any) -> tuple[str, str | None]:
    """(text, finish_reason) of a chat's only choice, whole or streamed."""
    body: dict[str, Any] = {"model": "succ", "messages": USER, "temperature": 0} | kw
    if not stream:
        reply = await client.chat.completions.create(**body)
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    text, finish = "", None
    async for chunk in await client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_generation_extras(client: openai.AsyncOpenAI, stream: bool) -> None:
    assert await text_of(client, stream, max_tokens=5, stop=["c"]) == ("b", "stop")
    # no stop string (nor stop token) before min_tokens
    held = await text_of(client, stream, max_tokens=5, stop=["c"], extra_body={"min_tokens": 3})
    assert held == ("bcdef", "length")
    kept = await text_of(
        client, stream, max_tokens=5, stop=["d"], extra_body={"include_stop_str_in_output": True}
    )
    assert kept == ("bcd", "stop")
    # the stop token that ends a choice is not its text, unless asked for
    token = {"stop_token_ids": [ord("d")]}
    assert await text_of(client, stream, max_tokens=5, extra_body=token) == ("bc", "stop")
    both = token | {"include_stop_str_in_output": True}
    assert await text_of(client, stream, max_tokens=5, extra_body=both) == ("bcd", "stop")


async def test_each_choice_stops_on_its_own(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="succ", messages=USER, n=3, max_tokens=8, stop=["e"], temperature=0
    )
    assert [(c.index, c.message.content, c.finish_reason) for c in reply.choices] == [
        (i, "bcd", "stop") for i in range(3)
    ]
    assert reply.usage is not None and reply.usage.completion_tokens == 3 * 4
    texts: dict[int, str] = {}
    async for chunk in await client.chat.completions.create(
        model="succ", messages=USER, n=3, max_tokens=8, stop=["e"], temperature=0, stream=True
    ):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert texts == {0: "bcd", 1: "bcd", 2: "bcd"}


async def test_model_aliases(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(model=ALIAS, messages=USER, max_tokens=2)
    assert reply.model == "succ"  # the canonical id
    listed = [m async for m in client.models.list()]
    assert [m.id for m in listed] == ["succ", ALIAS]
    assert all((m.model_extra or {})["max_model_len"] == 1024 for m in listed)
    assert (await client.models.retrieve(ALIAS)).id == ALIAS
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="succ-other", messages=USER)


async def test_chat_template_from_the_config_with_names_kwargs_and_developer(
    succ: LiveServer, client: openai.AsyncOpenAI
) -> None:
    messages = [
        {"role": "developer", "content": "be brief"},  # this template knows no developer
        {"role": "user", "content": "hi", "name": "ann"},
    ]
    body = {"model": "succ", "messages": messages, "chat_template_kwargs": {"suffix": "!a"}}
    doc = (await request("POST", succ.api + "/tokenize", body, AUTH)).doc
    assert bytes(doc["tokens"]) == b"[system]be brief[user:ann]hi!a"
    reply = await client.chat.completions.create(
        model="succ",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=3,
        temperature=0,
        extra_body={"chat_template_kwargs": {"suffix": "!a"}},
    )
    assert reply.choices[0].message.content == "bcd"  # after the rendered prompt's last "a"
    assert reply.usage is not None and reply.usage.prompt_tokens == len(doc["tokens"])


async def test_every_stream_ends_with_usage_when_the_server_says_so(
    client: openai.AsyncOpenAI,
) -> None:
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="succ", messages=USER, max_tokens=2, stream=True
        )
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2


async def test_probes_tokenizer_routes_and_metrics_on_the_api_port(succ: LiveServer) -> None:
    for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")):
        reply = await request(method, succ.api + path)  # no API key for probes
        assert (reply.status, reply.doc) == (200, {"status": "ready"}), path
    version = (await request("GET", succ.api + "/version")).doc["version"]
    assert version.count(".") == 2
    for prefix in ("", "/v1"):
        body = {"model": ALIAS, "prompt": "ab", "return_token_strs": True}
        doc = (await request("POST", f"{succ.api}{prefix}/tokenize", body, AUTH)).doc
        assert (doc["tokens"], doc["token_strs"]) == ([97, 98], ["a", "b"])
        body = {"model": "succ", "tokens": [257, 97]}
        doc = (await request("POST", f"{succ.api}{prefix}/detokenize", body, AUTH)).doc
        assert doc == {"prompt": "<|im_start|>a"}
        bad = await request(
            "POST", f"{succ.api}{prefix}/detokenize", body | {"tokens": [999]}, AUTH
        )
        assert (bad.status, bad.doc["error"]["param"]) == (400, "tokens")
    assert (
        await request("POST", succ.api + "/tokenize", {"model": "succ", "prompt": "a"})
    ).status == 401
    text = (await request("GET", succ.api + "/metrics")).body.decode()
    assert (
        "tl_engine_steps_total" in text and 'vllm:num_requests_running{model_name="succ"}' in text
    )


async def test_cors(succ: LiveServer) -> None:
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    reply = await request("OPTIONS", succ.api + "/v1/chat/completions", headers=preflight)
    assert reply.status == 204  # before any API key is asked for
    assert "POST" in reply.headers["Access-Control-Allow-Methods"]
    assert reply.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
    body = {"model": "succ", "messages": USER, "max_tokens": 2}
    for stream in (False, True):
        reply = await request(
            "POST",
            succ.api + "/v1/chat/completions",
            body | {"stream": stream},
            AUTH | {"Origin": ORIGIN},
        )
        assert reply.status == 200
        assert reply.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "X-Request-Id" in reply.headers["Access-Control-Expose-Headers"]
    other = await request(
        "POST", succ.api + "/v1/chat/completions", body, AUTH | {"Origin": "https://evil.example"}
    )
    assert other.status == 200 and "Access-Control-Allow-Origin" not in other.headers
    refused = await request(
        "OPTIONS",
        succ.api + "/v1/chat/completions",
        headers=preflight | {"Origin": "https://evil.example"},
    )
    # not answered as a preflight: it meets the API keys like any request
    assert refused.status == 401 and "Access-Control-Allow-Origin" not in refused.headers


async def test_vllm_metric_names(succ: LiveServer, client: openai.AsyncOpenAI) -> None:
    before = await metrics(succ.health)
    await client.chat.completions.create(model="succ", messages=USER, max_tokens=3)
    await client.chat.completions.create(model="succ", messages=USER, max_tokens=3, stop=["c"])
    # a client that leaves mid-stream
    async with aiohttp.ClientSession() as session:
        body = {"model": "succ", "messages": USER, "max_tokens": 200, "stream": True}
        async with session.post(succ.api + "/v1/chat/completions", json=body, headers=AUTH) as r:
            await r.content.readuntil(b"\n\n")
    await asyncio.sleep(0.5)
    after = await metrics(succ.health)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    m = "model_name=succ"
    assert delta(f"vllm:request_success_total{{finished_reason=length,{m}}}") == 1
    assert delta(f"vllm:request_success_total{{finished_reason=stop,{m}}}") == 1
    assert delta(f"vllm:request_success_total{{finished_reason=abort,{m}}}") == 1
    assert delta("tl_frontend_client_disconnects_total") == 1
    assert delta(f"vllm:prompt_tokens_total{{{m}}}") == 2 * len(b"[user]a")
    assert delta(f"vllm:generation_tokens_total{{{m}}}") >= 3 + 2
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ):
        assert delta(f"{name}_count{{{m}}}") >= 2, name
    assert delta(f"vllm:inter_token_latency_seconds_count{{{m}}}") >= 2
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert f"{name}{{{m}}}" in after, name
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions"):
        assert f"{name}_total{{{m}}}" in after, name
    assert "vllm:spec_decode_num_draft_tokens_total{model_name=succ}" in after
    assert delta("tl_engine_steps_total") >= 5


async def test_x_request_id_names_the_request_everywhere(
    succ: LiveServer, client: openai.AsyncOpenAI
) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model="succ",
        messages=USER,
        max_tokens=2,
        extra_headers={"X-Request-Id": "trace-abc.1"},
        extra_body={"frobnicate": 1},  # an unknown field: warned about, in the request's name
    )
    assert raw.headers["X-Request-Id"] == "trace-abc.1"
    assert raw.parse().id == "chatcmpl-trace-abc.1"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="succ", messages=USER, temperature=9, extra_headers={"X-Request-Id": "trace-x"}
        )
    assert "trace-x" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="succ", messages=USER, extra_headers={"X-Request-Id": "no spaces"}
        )
    assert refused.value.param == "X-Request-Id"
    # the same field again: warned once
    await client.chat.completions.create(
        model="succ", messages=USER, max_tokens=1, extra_body={"frobnicate": 2}
    )
    warned = [line for line in succ.log().splitlines() if "frobnicate" in line]
    assert len(warned) == 1 and "[trace-abc.1]" in warned[0]

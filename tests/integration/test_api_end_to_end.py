"""The HTTP API end to end on the succ model (after byte i, byte i + 1), over the wire: a real
frontend spawning a real engine core on loopback, shared by the module."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import LiveServer, default_engine, live_server, post, request

pytestmark = pytest.mark.integration
NOTHING_CACHED = {"prompt_tokens_details": {"cached_tokens": 0}}  # always written

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "a"}]
HAND: dict[str, Any] = {"model": "succ", "messages": MESSAGES, "max_tokens": 3, "temperature": 0}
MAX_BODY = 65536


@pytest.fixture(scope="module")
def succ(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = default_engine(tiny.succ, model_id="succ", max_body_bytes=MAX_BODY)
    with live_server(tmp_path_factory.mktemp("succ"), engine) as server:
        yield server


def raw_events(body: bytes) -> list[str]:
    """Events of an SSE body split strictly on blank lines; each must be one `data:` line."""
    text = body.decode()
    parts = text.split("\n\n")
    assert parts[-1] == "", f"the body does not end with a blank line: {text[-60:]!r}"
    for event in parts[:-1]:
        assert event.startswith("data: ") and "\n" not in event, repr(event)
    return [event[len("data: ") :] for event in parts[:-1]]


async def test_hand_example_chat_completion(succ: LiveServer) -> None:
    before = int(time.time())
    reply = await post(succ.api + CHAT, HAND)
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"].startswith("application/json")
    doc = reply.doc
    assert set(doc) == {"id", "object", "created", "model", "choices", "usage"}
    assert re.fullmatch(r"chatcmpl-[0-9A-Za-z]+", doc["id"])
    assert doc["object"] == "chat.completion"
    assert before - 1 <= doc["created"] <= time.time() + 1
    assert doc["model"] == "succ"
    assert doc["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "bcd"},
            "logprobs": None,
            "finish_reason": "length",  # cut by max_tokens: never "stop"
        }
    ]
    assert doc["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 3,
        "total_tokens": 4,
        **NOTHING_CACHED,
    }
    # another id per request; max_completion_tokens is the newer name of max_tokens
    newer = {k: v for k, v in HAND.items() if k != "max_tokens"} | {"max_completion_tokens": 3}
    again = (await post(succ.api + CHAT, newer)).doc
    assert again["id"] != doc["id"]
    assert again["choices"] == doc["choices"] and again["usage"] == doc["usage"]


async def test_stream_framing_role_first_then_done(succ: LiveServer) -> None:
    body = HAND | {"stream": True, "stream_options": {"include_usage": True}}
    reply = await post(succ.api + CHAT, body)
    assert reply.status == 200
    assert reply.headers["Content-Type"].split(";")[0] == "text/event-stream"
    events = raw_events(reply.body)
    assert len(events) == 6, events  # role, b, c, d (+ finish), usage, [DONE]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert {(c["object"], c["model"]) for c in chunks} == {("chat.completion.chunk", "succ")}
    assert len({c["created"] for c in chunks}) == 1
    choice = {"index": 0, "logprobs": None}
    assert chunks[0]["choices"] == [
        choice | {"delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    for chunk, text, finish in zip(chunks[1:4], "bcd", [None, None, "length"], strict=True):
        assert chunk["choices"] == [choice | {"delta": {"content": text}, "finish_reason": finish}]
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 3,
        "total_tokens": 4,
        **NOTHING_CACHED,
    }
    assert all(c.get("usage") is None for c in chunks[:4])
    # without include_usage: no usage chunk, still [DONE] last
    plain = raw_events((await post(succ.api + CHAT, HAND | {"stream": True})).body)
    assert len(plain) == 5 and plain[-1] == "[DONE]"
    assert all(json.loads(e).get("usage") is None for e in plain[:-1])


async def test_stop_strings_end_generation_across_tokens(succ: LiveServer) -> None:
    cases = [  # (stop, max_tokens, text, finish)
        (["de"], 10, "bc", "stop"),
        ("de", 10, "bc", "stop"),
        (["zz", "fgh", "de"], 10, "bc", "stop"),  # the first to complete wins
        (["b"], 10, "", "stop"),
        (["ef"], 3, "bcd", "length"),  # cut before the stop could complete: held text released
        (["zz"], 5, "bcdef", "length"),
    ]
    for stop, max_tokens, text, finish in cases:
        body = HAND | {"stop": stop, "max_tokens": max_tokens}
        doc = (await post(succ.api + CHAT, body)).doc
        assert doc["choices"][0]["message"]["content"] == text, (stop, doc)
        assert doc["choices"][0]["finish_reason"] == finish, (stop, doc)
        reply = await post(succ.api + CHAT, body | {"stream": True})
        chunks = reply.events[:-1]
        assert reply.events[-1] == "[DONE]"
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
        assert "".join(deltas) == text, (stop, deltas)
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == finish
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        if finish == "stop":  # nothing left to send: the finish rides on `delta: {}`
            assert chunks[-1]["choices"][0]["delta"] == {}
    # the generated tokens b, c, d, e are all counted, the stop string's too
    doc = (await post(succ.api + CHAT, HAND | {"stop": ["de"], "max_tokens": 10})).doc
    assert doc["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 4,
        "total_tokens": 5,
        **NOTHING_CACHED,
    }
    completion = {"model": "succ", "prompt": "a", "stop": ["de"], "max_tokens": 10}
    doc = (await post(succ.api + COMPLETIONS, completion)).doc
    assert (doc["choices"][0]["text"], doc["choices"][0]["finish_reason"]) == ("bc", "stop")


def chat(**fields: Any) -> dict[str, Any]:
    return HAND | fields


E400 = "invalid_request_error"  # every refusal of the table has this type
BAD: list[tuple[str, str, Any, dict[str, str], int, str, str | None]] = [
    # (method, path, body, headers, status, code, param): the README's error table, pinned
    ("POST", CHAT, chat(temperature=2.5), {}, 400, "invalid_value", "temperature"),
    ("POST", CHAT, chat(temperature=-1), {}, 400, "invalid_value", "temperature"),
    ("POST", CHAT, chat(temperature="hot"), {}, 400, "invalid_value", "temperature"),
    ("POST", CHAT, chat(top_p=0), {}, 400, "invalid_value", "top_p"),
    ("POST", CHAT, chat(top_p=1.5), {}, 400, "invalid_value", "top_p"),
    ("POST", CHAT, chat(max_tokens=0), {}, 400, "invalid_value", "max_tokens"),
    ("POST", CHAT, chat(stop=list("abcde")), {}, 400, "invalid_value", "stop"),
    ("POST", CHAT, b"{not json", {}, 400, "invalid_json", None),
    ("POST", CHAT, {"messages": MESSAGES}, {}, 400, "missing_required_parameter", "model"),
    ("POST", CHAT, {"model": "succ"}, {}, 400, "missing_required_parameter", "messages"),
    ("POST", CHAT, chat(messages=[]), {}, 400, "missing_required_parameter", "messages"),
    ("POST", COMPLETIONS, {"model": "succ"}, {}, 400, "missing_required_parameter", "prompt"),
    ("POST", "/v1/embeddings", {"model": "succ"}, {}, 400, "missing_required_parameter", "input"),
    ("POST", CHAT, chat(max_tokens=1024), {}, 400, "context_length_exceeded", "messages"),
    ("POST", COMPLETIONS, {"model": "succ", "prompt": "ab", "max_tokens": 1023}, {}, 400,
     "context_length_exceeded", "prompt"),
    ("POST", CHAT, HAND, {"X-TL-Priority": "high"}, 400, "invalid_value", "X-TL-Priority"),
    ("POST", CHAT, HAND, {"X-TL-Priority": "101"}, 400, "invalid_value", "X-TL-Priority"),
    ("POST", CHAT, chat(n=129), {}, 400, "invalid_value", "n"),
    ("POST", CHAT, chat(echo=True), {}, 422, "unsupported_parameter", "echo"),
    ("POST", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url",
     "image_url": {"url": "x"}}]}]), {}, 422, "unsupported_parameter", "messages[0].content"),
    ("POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), {}, 422,
     "unsupported_parameter", "tools"),
    ("POST", CHAT, chat(tool_choice="auto"), {}, 422, "unsupported_parameter", "tool_choice"),
    ("POST", CHAT, chat(response_format={"type": "json_object"}), {}, 422,
     "unsupported_parameter", "response_format"),
    ("POST", CHAT, chat(model="gpt-4"), {}, 404, "model_not_found", "model"),
    ("GET", "/v1/nope", None, {}, 404, "not_found", None),
    ("GET", CHAT, None, {}, 405, "method_not_allowed", None),
    ("POST", CHAT, b"x" * (MAX_BODY + 1), {}, 413, "request_too_large", None),
]  # fmt: skip


async def test_errors_use_the_openai_shape(succ: LiveServer) -> None:
    wrong = []
    for method, path, body, headers, status, code, param in BAD:
        reply = await request(method, succ.api + path, body, headers)
        got: Any = reply.body
        if reply.headers.get("Content-Type", "").startswith("application/json"):
            got = reply.doc
        want = {"error": {"message": "…", "type": E400, "param": param, "code": code}}
        if isinstance(got, dict) and isinstance(got.get("error"), dict):
            message = got["error"].get("message")
            if isinstance(message, str) and message:
                want["error"]["message"] = message
        if reply.status != status or got != want or not reply.headers.get("X-Request-Id"):
            wrong.append((method, path, str(body)[:60], headers, reply.status, got))
    assert not wrong, "\n".join(map(str, wrong))
    # unknown fields are ignored; n choices and echo are served
    doc = (await post(succ.api + CHAT, chat(frobnicate=1, user="u", n=2))).doc
    assert [c["message"]["content"] for c in doc["choices"]] == ["bcd", "bcd"]
    body = {"model": "succ", "prompt": "a", "echo": True, "max_tokens": 2}
    assert (await post(succ.api + COMPLETIONS, body)).doc["choices"][0]["text"] == "abc"


async def test_completions_endpoint_and_usage(succ: LiveServer) -> None:
    reply = await post(succ.api + COMPLETIONS, {"model": "succ", "prompt": "a"})
    doc = reply.doc
    assert reply.status == 200
    assert set(doc) == {"id", "object", "created", "model", "choices", "usage"}
    assert doc["id"].startswith("cmpl-")
    assert (doc["object"], doc["model"]) == ("text_completion", "succ")
    default = "bcdefghijklmnopq"  # 16 tokens by default
    assert doc["choices"] == [
        {"index": 0, "text": default, "logprobs": None, "finish_reason": "length"}
    ]
    assert doc["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 16,
        "total_tokens": 17,
        **NOTHING_CACHED,
    }
    # a prompt of token ids; max_tokens; streamed chunks concatenate to the same text
    doc = (
        await post(succ.api + COMPLETIONS, {"model": "succ", "prompt": [120], "max_tokens": 3})
    ).doc
    assert doc["choices"][0]["text"] == "yz{"
    body = {
        "model": "succ",
        "prompt": "a",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = (await post(succ.api + COMPLETIONS, body)).events
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert {c["object"] for c in events[:-1]} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == default
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert (usage["choices"], usage["usage"]["completion_tokens"]) == ([], 16)


async def test_tokenize_models_health_and_request_id(succ: LiveServer) -> None:
    doc = (await post(succ.api + "/v1/tokenize", {"model": "succ", "prompt": "abc"})).doc
    assert doc == {"tokens": [97, 98, 99], "count": 3, "max_model_len": 1024}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    doc = (await post(succ.api + "/v1/tokenize", {"model": "succ", "messages": messages})).doc
    assert doc["tokens"] == list(b"hiyo") and doc["count"] == 4  # the succ template concatenates
    # special tokens written in a prompt are special tokens
    doc = (await post(succ.api + "/v1/tokenize", {"model": "succ", "prompt": "<|im_start|>a"})).doc
    assert doc["tokens"] == [257, 97]
    models = (await request("GET", succ.api + "/v1/models")).doc
    assert models["object"] == "list"
    [entry] = models["data"]
    assert set(entry) == {"id", "object", "created", "owned_by", "max_model_len"}
    assert entry["max_model_len"] == 1024
    assert (entry["id"], entry["object"]) == ("succ", "model")
    assert isinstance(entry["created"], int) and entry["owned_by"]
    assert (await request("GET", succ.api + "/v1/models/succ")).doc == entry
    missing = await request("GET", succ.api + "/v1/models/nope")
    assert (missing.status, missing.doc["error"]["code"]) == (404, "model_not_found")
    for url in (succ.api + "/healthz", succ.health + "/healthz", succ.health + "/readyz"):
        assert (await request("GET", url)).status == 200, url
    # X-Request-Id: echoed on every kind of response, generated (and unique) otherwise
    echoed = [
        ("POST", succ.api + CHAT, HAND),
        ("POST", succ.api + CHAT, HAND | {"stream": True}),
        ("POST", succ.api + CHAT, chat(temperature=9)),
        ("GET", succ.api + "/v1/nope", None),
        ("GET", succ.api + "/v1/models", None),
        ("POST", succ.api + "/v1/tokenize", {"model": "succ", "prompt": "a"}),
        ("GET", succ.health + "/readyz", None),
        ("GET", succ.health + "/metrics", None),
    ]
    for i, (method, url, body) in enumerate(echoed):
        reply = await request(method, url, body, {"X-Request-Id": f"trace-{i}"})
        assert reply.headers.get("X-Request-Id") == f"trace-{i}", (url, body)
        generated = (await request(method, url, body)).headers.get("X-Request-Id")
        again = (await request(method, url, body)).headers.get("X-Request-Id")
        assert generated and again and generated != again, url

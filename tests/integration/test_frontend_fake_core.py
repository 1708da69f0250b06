"""The frontend against a fake core over real ZeroMQ: generation, plain and streamed."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import TinyModels
from tests.fixtures.frontend_harness import eventually, serving, sse_data, sse_events

pytestmark = pytest.mark.integration
NOTHING_CACHED = {"prompt_tokens_details": {"cached_tokens": 0}}  # always written


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "succ", "messages": [{"role": "user", "content": content}]} | extra


async def post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, Any, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as resp,
    ):
        text = await resp.text()
        parsed = await resp.json() if resp.content_type == "application/json" else text
        return resp.status, parsed, resp.headers.get("Content-Type", "")


async def test_hand_example_chat_completion(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, doc, _ = await post(
            f"{s.api}/v1/chat/completions", chat("a", max_tokens=3, temperature=0)
        )
        assert status == 200
        assert doc["id"].startswith("chatcmpl-")
        assert isinstance(doc["created"], int)
        del doc["id"], doc["created"]
        assert doc == {
            "object": "chat.completion",
            "model": "succ",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "bcd"},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens": 3,
                "total_tokens": 4,
                **NOTHING_CACHED,
            },
        }
        [submit] = s.core.submitted()
        assert submit.prompt_ids == [97]
        assert submit.params.max_tokens == 3
        assert submit.params.temperature == 0
        assert submit.params.stop_token_ids == (256,)


async def test_chat_stream_framing(tiny: TinyModels) -> None:
    body = chat("a", max_tokens=3, stream=True, stream_options={"include_usage": True})
    async with serving(tiny.succ) as s:
        status, text, content_type = await post(f"{s.api}/v1/chat/completions", body)
    assert status == 200
    assert content_type.startswith("text/event-stream")
    assert len(sse_events(text)) == 6  # role, b, c, d + finish, usage, [DONE]
    role, b, c, d, usage, done = sse_data(text)
    assert done == "[DONE]"
    assert len({role["id"], b["id"], c["id"], d["id"], usage["id"]}) == 1
    assert {x["object"] for x in (role, b, c, d, usage)} == {"chat.completion.chunk"}
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["choices"][0]["finish_reason"] is None
    deltas = [x["choices"][0]["delta"] for x in (b, c, d)]
    assert deltas == [{"content": "b"}, {"content": "c"}, {"content": "d"}]
    assert [x["choices"][0]["finish_reason"] for x in (b, c, d)] == [None, None, "length"]
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 3,
        "total_tokens": 4,
        **NOTHING_CACHED,
    }


async def test_stream_without_include_usage_has_no_usage_chunk(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        _, text, _ = await post(
            f"{s.api}/v1/chat/completions", chat("a", max_tokens=2, stream=True)
        )
    docs = sse_data(text)
    assert docs[-1] == "[DONE]"
    assert all("usage" not in d for d in docs[:-1])
    assert docs[-2]["choices"][0] == {
        "index": 0,
        "delta": {"content": "c"},
        "logprobs": None,
        "finish_reason": "length",
    }


async def test_completions_default_max_tokens_and_usage(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, doc, _ = await post(f"{s.api}/v1/completions", {"model": "succ", "prompt": "a"})
    assert status == 200
    assert doc["object"] == "text_completion"
    assert doc["id"].startswith("cmpl-")
    assert doc["choices"] == [
        {"index": 0, "text": "bcdefghijklmnopq", "logprobs": None, "finish_reason": "length"}
    ]
    assert doc["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 16,
        "total_tokens": 17,
        **NOTHING_CACHED,
    }


async def test_completions_stream_has_no_role_chunk(tiny: TinyModels) -> None:
    body = {"model": "succ", "prompt": "a", "max_tokens": 3, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with serving(tiny.succ) as s:
        _, text, _ = await post(f"{s.api}/v1/completions", body)
    *chunks, usage, done = sse_data(text)
    assert done == "[DONE]"
    assert [c["choices"][0]["text"] for c in chunks] == ["b", "c", "d"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_across_tokens_ends_generation(tiny: TinyModels, stream: bool) -> None:
    body = chat("a", max_tokens=10, stop=["de"], stream=stream)
    async with serving(tiny.succ, core={"step_delay_s": 0.02}) as s:
        status, doc, _ = await post(f"{s.api}/v1/chat/completions", body)
        assert status == 200
        if stream:
            chunks = sse_data(doc)[1:-1]
            content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
            rid = chunks[0]["id"].removeprefix("chatcmpl-")  # the core's id of the request
            # d was held back (a prefix of "de"), then dropped with the stop string
            assert [c["choices"][0]["delta"] for c in chunks] == [
                {"content": "b"},
                {"content": "c"},
                {},
            ]
        else:
            content, finish = (
                doc["choices"][0]["message"]["content"],
                doc["choices"][0]["finish_reason"],
            )
            rid = doc["id"].removeprefix("chatcmpl-")
            assert doc["usage"]["completion_tokens"] == 4  # b c d e: every generated token
        assert (content, finish) == ("bc", "stop")
        # the core was still generating: it is told to stop
        await eventually(lambda: rid in s.core.aborted())


@pytest.mark.parametrize("stream", [False, True])
async def test_eos_finishes_with_stop_and_counts(tiny: TinyModels, stream: bool) -> None:
    # the fake core: after "z" comes EOS (256), a stop token of the model
    body = chat("x", max_tokens=10, stream=stream, stream_options={"include_usage": True})
    if not stream:
        del body["stream_options"]
    async with serving(tiny.succ) as s:
        _, doc, _ = await post(f"{s.api}/v1/chat/completions", body)
        assert s.core.aborted() == []  # the core finished it itself
    if stream:
        _, y, z, finish, usage, _ = sse_data(doc)
        assert [y["choices"][0]["delta"], z["choices"][0]["delta"]] == [
            {"content": "y"},
            {"content": "z"},
        ]
        assert finish["choices"][0]["delta"] == {}  # nothing left: the finish rides alone
        assert finish["choices"][0]["finish_reason"] == "stop"
        assert usage["usage"]["completion_tokens"] == 3
    else:
        assert doc["choices"][0]["message"]["content"] == "yz"
        assert doc["choices"][0]["finish_reason"] == "stop"
        assert doc["usage"] == {
            "prompt_tokens": 1,
            "completion_tokens": 3,
            "total_tokens": 4,
            **NOTHING_CACHED,
        }


async def test_chat_default_max_tokens_is_the_rest_of_the_context(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core={"max_model_len": 8}) as s:
        _, doc, _ = await post(f"{s.api}/v1/chat/completions", chat("ab"))
        assert s.core.submitted()[0].params.max_tokens == 6
    assert doc["choices"][0]["message"]["content"] == "cdefgh"
    assert doc["choices"][0]["finish_reason"] == "length"


async def test_usage_counts_the_templated_prompt(tiny: TinyModels) -> None:
    body = {
        "model": "succ",
        "messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"}],
        "max_tokens": 1,
    }
    async with serving(tiny.succ) as s:
        _, doc, _ = await post(f"{s.api}/v1/chat/completions", body)
        assert s.core.submitted()[0].prompt_ids == [97, 98, 99, 100]
    assert doc["usage"]["prompt_tokens"] == 4
    assert doc["choices"][0]["message"]["content"] == "e"


async def test_completion_prompt_parses_special_tokens(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        await post(f"{s.api}/v1/completions", {"model": "succ", "prompt": "<|im_start|>a"})
        await post(f"{s.api}/v1/completions", {"model": "succ", "prompt": [97, 98]})
        assert [m.prompt_ids for m in s.core.submitted()] == [[257, 97], [97, 98]]


async def test_priority_header_reaches_the_core(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, _, _ = await post(
            f"{s.api}/v1/chat/completions", chat("a", max_tokens=1), **{"X-TL-Priority": "-7"}
        )
        assert status == 200
        assert s.core.submitted()[0].priority == -7


async def test_chat_logprobs(tiny: TinyModels) -> None:
    body = chat("a", max_tokens=2, logprobs=True, top_logprobs=1)
    async with serving(tiny.succ) as s:
        _, doc, _ = await post(f"{s.api}/v1/chat/completions", body)
        assert s.core.submitted()[0].params.logprobs == 1
    assert doc["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": t,
                "logprob": -0.5,
                "bytes": [ord(t)],
                "top_logprobs": [{"token": t, "logprob": -0.5, "bytes": [ord(t)]}],
            }
            for t in "bc"
        ]
    }


async def test_completion_logprobs_streamed(tiny: TinyModels) -> None:
    body = {"model": "succ", "prompt": "a", "max_tokens": 2, "logprobs": 2, "stream": True}
    async with serving(tiny.succ) as s:
        _, text, _ = await post(f"{s.api}/v1/completions", body)
    b, c, _ = sse_data(text)
    assert b["choices"][0]["logprobs"] == {
        "tokens": ["b"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"b": -0.5, "c": -1.5}],
        "text_offset": [0],
    }
    assert c["choices"][0]["logprobs"]["text_offset"] == [1]


async def test_ping_after_silence(tiny: TinyModels) -> None:
    body = chat("a", max_tokens=3, stream=True)
    async with serving(tiny.succ, core={"step_delay_s": 0.35}, ping_interval_s=0.1) as s:
        _, text, _ = await post(f"{s.api}/v1/chat/completions", body)
    events = sse_events(text)
    assert ": ping" in events
    assert [e for e in events if e != ": ping"][-1] == "data: [DONE]"
    content = "".join(d["choices"][0]["delta"].get("content", "") for d in sse_data(text)[1:-1])
    assert content == "bcd"

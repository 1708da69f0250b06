"""The official `openai` client against the frontend (and a fake core)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from shared.protocol import RejectReason
from tests.conftest import TinyModels
from tests.fixtures.fake_core import fake_embedding
from tests.fixtures.frontend_harness import Serving, serving

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "a"}]


@pytest.fixture
async def live(tiny: TinyModels) -> AsyncIterator[tuple[Serving, openai.AsyncOpenAI]]:
    async with serving(tiny.succ) as s:
        client = openai.AsyncOpenAI(base_url=s.api + "/v1", api_key="unused", max_retries=0)
        yield s, client
        await client.close()


async def test_chat(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    _, client = live
    reply = await client.chat.completions.create(
        model="succ", messages=MESSAGES, max_tokens=3, temperature=0
    )
    assert reply.choices[0].message.content == "bcd"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1, 3)


async def test_streamed_chat(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    _, client = live
    stream = await client.chat.completions.create(
        model="succ",
        messages=MESSAGES,
        max_tokens=5,
        stop=["ef"],
        stream=True,
        stream_options={"include_usage": True},
    )
    content, finishes, usage, ids = "", [], None, set()
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finishes.append(choice.finish_reason)
    assert content == "bcd"
    assert [f for f in finishes if f] == ["stop"]
    assert usage is not None and usage.completion_tokens == 5
    assert len(ids) == 1


async def test_completions(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    _, client = live
    reply = await client.completions.create(model="succ", prompt="a", max_tokens=3)
    assert reply.choices[0].text == "bcd"
    assert reply.choices[0].finish_reason == "length"
    stream = await client.completions.create(model="succ", prompt="k", max_tokens=2, stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == "lm"


async def test_embeddings_default_base64(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    _, client = live
    result = await client.embeddings.create(model="succ", input=["ab", "c"])
    assert [d.index for d in result.data] == [0, 1]
    assert result.data[0].embedding == pytest.approx(fake_embedding([97, 98]), rel=1e-6)
    assert result.data[1].embedding == pytest.approx(fake_embedding([99]), rel=1e-6)
    assert result.usage.prompt_tokens == 3
    floats = await client.embeddings.create(model="succ", input="ab", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(fake_embedding([97, 98]))


async def test_models(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    _, client = live
    models = [m async for m in client.models.list()]
    assert [(m.id, m.object, m.owned_by) for m in models] == [("succ", "model", "tl-serve")]
    assert (await client.models.retrieve("succ")).id == "succ"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")


async def test_errors_reach_the_client(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    s, client = live
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="succ", messages=MESSAGES, temperature=5)
    assert (bad.value.code, bad.value.param) == ("invalid_value", "temperature")
    with pytest.raises(openai.UnprocessableEntityError):
        await client.chat.completions.create(
            model="succ", messages=MESSAGES, extra_body={"echo": True}
        )
    s.core.reject = RejectReason.QUEUE_FULL
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model="succ", messages=MESSAGES, stream=True)
    assert limited.value.response.headers["Retry-After"] == "1"


async def test_what_the_core_is_sent(live: tuple[Serving, openai.AsyncOpenAI]) -> None:
    s, client = live
    await client.chat.completions.create(
        model="succ",
        messages=MESSAGES,
        max_tokens=2,
        n=3,
        extra_body={"priority": 5, "cache_salt": "t1", "min_tokens": 1},
        extra_headers={"X-Request-Id": "req-7"},
    )
    [submit] = s.core.submitted()
    assert (submit.rid, submit.n, submit.cache_salt) == ("req-7", 3, "t1")
    assert submit.priority == -5  # vLLM's priority: lower first; the core's: higher first
    assert submit.params.min_tokens == 1
    await client.chat.completions.create(
        model="succ",
        messages=MESSAGES,
        max_tokens=2,
        extra_body={"priority": 5},
        extra_headers={"X-TL-Priority": "9"},
    )
    assert s.core.submitted()[-1].priority == 9  # the header wins
    reply = await client.completions.create(
        model="succ", prompt=["a", "k"], max_tokens=2, extra_headers={"X-Request-Id": "many"}
    )
    assert [m.rid for m in s.core.submitted()[-2:]] == ["many", "many-1"]
    assert [(c.index, c.text) for c in reply.choices] == [(0, "bc"), (1, "lm")]


async def test_unknown_fields_are_warned_about_once(
    live: tuple[Serving, openai.AsyncOpenAI], caplog: pytest.LogCaptureFixture
) -> None:
    _, client = live
    for value in (1, 2):
        reply = await client.chat.completions.create(
            model="succ", messages=MESSAGES, max_tokens=1, extra_body={"frobnicate": value}
        )
        assert reply.choices[0].message.content == "b"  # ignored
    warned = [r for r in caplog.records if "frobnicate" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"

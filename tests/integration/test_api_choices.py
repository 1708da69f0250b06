"""The official `openai` client against a real frontend and core on the tiny random llama (a byte
tokenizer: one token a byte): n choices, several prompts, echo and prompt logprobs (the
lm-eval-harness request), logit_bias, skip_special_tokens, cache salts, continuous usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import openai
import pytest

from tests.conftest import TinyModels
from tests.fixtures import reference
from tests.fixtures.live_server import LiveServer, default_engine, live_server, metrics

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def llama(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # fp32 K and V: the logprobs are held to the float64 forward pass within 2e-3 (fp16 K and V
    # move them by up to ~5e-3 on this tiny model)
    engine = default_engine(tiny.hf, model_id="tiny", max_num_seqs=16, kv_cache_dtype="f32")
    with live_server(tmp_path_factory.mktemp("choices"), engine) as server:
        yield server


@pytest.fixture
async def client(llama: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=llama.api + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(-1, keepdims=True)
    out: np.ndarray = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return out


async def chat_texts(client: openai.AsyncOpenAI, stream: bool, **kw: Any) -> dict[int, str]:
    """Each choice's text, by index (streamed: the deltas of its chunks, in order)."""
    if not stream:
        reply = await client.chat.completions.create(model="tiny", messages=MESSAGES, **kw)
        return {c.index: c.message.content or "" for c in reply.choices}
    texts: dict[int, str] = {}
    roles: list[int] = []
    async for chunk in await client.chat.completions.create(
        model="tiny", messages=MESSAGES, stream=True, **kw
    ):
        for c in chunk.choices:
            if c.delta.role is not None:
                roles.append(c.index)
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert sorted(roles) == sorted(texts)  # a role chunk for every choice
    return texts


async def completion_texts(client: openai.AsyncOpenAI, stream: bool, **kw: Any) -> dict[int, str]:
    if not stream:
        reply = await client.completions.create(model="tiny", **kw)
        return {c.index: c.text for c in reply.choices}
    texts: dict[int, str] = {}
    async for chunk in await client.completions.create(model="tiny", stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    return texts


@pytest.mark.parametrize("stream", [False, True])
async def test_n_seeded_choices_repeat_and_differ(client: openai.AsyncOpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {"n": 4, "seed": 7, "temperature": 1.0, "max_tokens": 16}
    first = await chat_texts(client, stream, **kw)
    assert sorted(first) == [0, 1, 2, 3]
    assert len(set(first.values())) == 4  # each choice samples on its own
    assert await chat_texts(client, stream, **kw) == first
    assert await chat_texts(client, not stream, **kw) == first
    # choice i samples as a request seeded seed + i would
    single = await chat_texts(client, False, **(kw | {"n": 1, "seed": 9}))
    assert single[0] == first[2]
    texts = await completion_texts(client, stream, prompt="Once", **kw)
    assert len(set(texts.values())) == 4
    assert await completion_texts(client, stream, prompt="Once", **kw) == texts


async def test_eight_choices_cost_one_prefill(
    llama: LiveServer, client: openai.AsyncOpenAI
) -> None:
    before = await metrics(llama.health)
    prompt = "A prompt that nothing else in this module sends, of some length."
    reply = await client.completions.create(
        model="tiny",
        prompt=prompt,
        n=8,
        max_tokens=6,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    after = await metrics(llama.health)
    assert len(reply.choices) == 8 and reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt.encode())  # the prompt counts once
    assert reply.usage.completion_tokens == sum(6 for _ in reply.choices)
    # the core computed the prompt once (it was never cached: nothing to take from there)
    prefill = "tl_engine_prefill_tokens_total"
    assert after[prefill] - before[prefill] == len(prompt.encode())
    key = "vllm:prompt_tokens_total{model_name=tiny}"
    assert after[key] - before.get(key, 0) == len(prompt.encode())


@pytest.mark.parametrize("stream", [False, True])
async def test_several_prompts_in_one_completion(client: openai.AsyncOpenAI, stream: bool) -> None:
    prompts = ["Hello", "The quick brown fox", "é"]
    alone = [
        (await completion_texts(client, False, prompt=p, max_tokens=8, temperature=0))[0]
        for p in prompts
    ]
    texts = await completion_texts(client, stream, prompt=prompts, n=2, max_tokens=8, temperature=0)
    assert texts == {p * 2 + j: alone[p] for p in range(3) for j in range(2)}
    ids = [list(p.encode()) for p in prompts]
    assert await completion_texts(client, stream, prompt=ids, max_tokens=8, temperature=0) == dict(
        enumerate(alone)
    )
    reply = await client.completions.create(
        model="tiny", prompt=prompts, max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(len(p.encode()) for p in prompts)
    assert reply.usage.completion_tokens == 3 * 8


@pytest.mark.parametrize("max_tokens", [0, 1])
async def test_lm_eval_loglikelihood_requests_get_the_forward_passes_logprobs(
    client: openai.AsyncOpenAI, tiny: TinyModels, max_tokens: int
) -> None:
    """lm-eval-harness `local-completions`: token-id prompts, echo, logprobs 1, max_tokens 0 or
    1; it sums token_logprobs[ctxlen:-1] and checks each against the best of its top."""
    cfg, state = reference.state_from_hf(tiny.hf)
    prompts = [list(b"The capital of France is Paris"), list(b"2 + 2 = 4")]
    # a cached prefix must change nothing: every position is computed
    await client.completions.create(model="tiny", prompt=prompts[0], max_tokens=1)
    reply = await client.completions.create(
        model="tiny",
        prompt=prompts,
        echo=True,
        logprobs=1,
        max_tokens=max_tokens,
        temperature=0,
        seed=1234,
    )
    for choice, ids in zip(sorted(reply.choices, key=lambda c: c.index), prompts, strict=True):
        assert choice.text.startswith(bytes(ids).decode())
        logprobs = choice.logprobs
        assert logprobs is not None
        assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
        assert len(logprobs.token_logprobs) == len(ids) + max_tokens
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        want = log_softmax(reference.forward(cfg, state, ids)[0])
        got = logprobs.token_logprobs[1 : len(ids)]
        np.testing.assert_allclose(got, [want[p, t] for p, t in enumerate(ids[1:])], atol=2e-3)
        for p, top in enumerate(logprobs.top_logprobs[1 : len(ids)]):
            assert top is not None and len(top) == 1
            assert next(iter(top.values())) == pytest.approx(want[p].max(), abs=2e-3)
        if max_tokens:  # the generated token is the greedy one
            assert logprobs.token_logprobs[-1] == pytest.approx(want[-1].max(), abs=2e-3)


async def test_echo_streams_the_prompt_first(client: openai.AsyncOpenAI) -> None:
    chunks = [
        c
        async for c in await client.completions.create(
            model="tiny", prompt="Hello", echo=True, max_tokens=4, temperature=0, stream=True
        )
    ]
    assert chunks[0].choices[0].text.startswith("Hello")
    whole = await client.completions.create(
        model="tiny", prompt="Hello", echo=True, max_tokens=4, temperature=0
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


async def test_vllm_prompt_logprobs(client: openai.AsyncOpenAI, tiny: TinyModels) -> None:
    cfg, state = reference.state_from_hf(tiny.hf)
    prompt = "Hi there"
    ids = list(prompt.encode())
    want = log_softmax(reference.forward(cfg, state, ids)[0])
    reply = await client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, n=2, extra_body={"prompt_logprobs": 2}
    )
    for choice in reply.choices:  # every choice of the prompt carries them
        scored = (choice.model_extra or {})["prompt_logprobs"]
        assert scored[0] is None and len(scored) == len(ids)
        for p, entry in enumerate(scored[1:]):
            own = entry[str(ids[p + 1])]
            assert own["logprob"] == pytest.approx(want[p, ids[p + 1]], abs=2e-3)
            assert own["rank"] == 1 + int((want[p] > want[p, ids[p + 1]]).sum())
            best = int(np.argmax(want[p]))
            assert entry[str(best)]["rank"] == 1 and entry[str(best)]["decoded_token"]
    chat = await client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    scored = (chat.model_extra or {})["prompt_logprobs"]
    assert scored[0] is None and all(len(entry) == 1 for entry in scored[1:])
    with pytest.raises(openai.BadRequestError) as refused:  # vLLM's rule too
        await client.completions.create(
            model="tiny", prompt="x", stream=True, extra_body={"prompt_logprobs": 1}
        )
    assert refused.value.param == "prompt_logprobs"


@pytest.mark.parametrize("stream", [False, True])
async def test_logit_bias_and_special_tokens(client: openai.AsyncOpenAI, stream: bool) -> None:
    plain = (await chat_texts(client, stream, max_tokens=4, temperature=0))[0]
    forced = await chat_texts(client, stream, max_tokens=4, temperature=0, logit_bias={"65": 100})
    assert forced[0] == "AAAA" != plain
    # a special token, forced: left out of the text unless skip_special_tokens is false
    im_start = {"257": 100}
    assert (await chat_texts(client, stream, max_tokens=2, temperature=0, logit_bias=im_start))[
        0
    ] == ""
    kept = await chat_texts(
        client,
        stream,
        max_tokens=2,
        temperature=0,
        logit_bias=im_start,
        extra_body={"skip_special_tokens": False},
    )
    assert kept[0] == "<|im_start|><|im_start|>"
    with pytest.raises(openai.BadRequestError) as refused:
        await chat_texts(client, stream, max_tokens=2, logit_bias={"100000": 1})
    assert refused.value.param == "logit_bias"


@pytest.mark.parametrize("stream", [False, True])
async def test_cache_salts_and_cached_tokens(client: openai.AsyncOpenAI, stream: bool) -> None:
    # stream or not, a prompt of its own from the first block on
    prompt = f"{stream:d}" + "x" * 64 + " and then something else entirely, to be cached"
    usage: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream else {}

    async def cached(**kw: Any) -> int:
        body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 1} | usage | kw
        if stream:
            chunks = [c async for c in await client.completions.create(stream=True, **body)]
            reply_usage = chunks[-1].usage
        else:
            reply_usage = (await client.completions.create(**body)).usage
        assert reply_usage is not None and reply_usage.prompt_tokens_details is not None
        return reply_usage.prompt_tokens_details.cached_tokens or 0

    assert await cached() == 0  # there, and 0, when nothing was cached
    # the prompt again: 6 whole blocks of 16 and 15 slots copied from its seventh, all but the
    # last of its 112 tokens (there must be one to compute)
    assert await cached() == 111
    assert await cached(extra_body={"cache_salt": "tenant-a"}) == 0
    assert await cached(extra_body={"cache_salt": "tenant-a"}) == 111
    assert await cached(extra_body={"cache_salt": "tenant-b"}) == 0


async def test_continuous_usage_stats(client: openai.AsyncOpenAI) -> None:
    usages = []
    async for chunk in await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
    ):
        if chunk.choices and chunk.choices[0].delta.role is None:
            assert chunk.usage is not None
            usages.append(chunk.usage.completion_tokens)
    assert usages == sorted(usages) and usages[-1] == 5

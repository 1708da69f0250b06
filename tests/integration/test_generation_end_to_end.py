"""Generation end to end on the tiny random llama (no chat template: the default one), over the
wire: a real frontend spawning a real engine core, shared by the module."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.conftest import TinyModels
from tests.fixtures import reference
from tests.fixtures.live_server import LiveServer, default_engine, live_server, metrics, post

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPTS = ["Hello", "The quick brown fox", "héllo wörld ☃", "a", "0123456789" * 4, "de de de"]


@pytest.fixture(scope="module")
def llama(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = default_engine(tiny.hf, model_id="tiny")
    with live_server(tmp_path_factory.mktemp("tiny"), engine) as server:
        yield server


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}]} | fields


def text_of(doc: dict[str, Any]) -> str:
    choice = doc["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


async def whole(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """Non-streamed: (text, finish_reason, completion_tokens)."""
    reply = await post(server.api + path, body | {"stream": False})
    assert reply.status == 200, reply.body
    doc = reply.doc
    return text_of(doc), doc["choices"][0]["finish_reason"], doc["usage"]["completion_tokens"]


async def streamed(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """Streamed with the usage chunk: (concatenated deltas, finish_reason, completion_tokens)."""
    options = {"stream": True, "stream_options": {"include_usage": True}}
    reply = await post(server.api + path, body | options)
    assert reply.status == 200, reply.body
    events = reply.events
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    pieces = []
    for chunk in chunks:
        choice = chunk["choices"][0]
        pieces.append(choice["delta"].get("content") or "" if path == CHAT else choice["text"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None
    return "".join(pieces), finishes[-1], usage["usage"]["completion_tokens"]


async def test_stream_equals_nonstream_at_temperature_0(llama: LiveServer) -> None:
    for prompt in PROMPTS:
        for path, body in (
            (CHAT, chat(prompt, max_tokens=40, temperature=0)),
            (COMPLETIONS, {"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0}),
            (CHAT, chat(prompt, max_tokens=40, temperature=0, stop=["\n", "e"])),
        ):
            plain = await whole(llama, path, body)
            assert plain[2] >= 1
            assert await streamed(llama, path, body) == plain, (path, prompt)
            assert await whole(llama, path, body) == plain  # greedy repeats itself


async def test_seed_reproduces_sampling(llama: LiveServer) -> None:
    for path, body in (
        (CHAT, chat("Hello", max_tokens=32, temperature=1.0)),
        (COMPLETIONS, {"model": "tiny", "prompt": "abc", "max_tokens": 32, "temperature": 1.0}),
    ):
        first = await whole(llama, path, body | {"seed": 1234})
        assert await whole(llama, path, body | {"seed": 1234}) == first
        assert await streamed(llama, path, body | {"seed": 1234}) == first
        others = {await whole(llama, path, body | {"seed": seed}) for seed in (1, 2, 3)}
        assert first not in others and len(others) == 3  # another seed, another sample
        greedy = await whole(llama, path, body | {"temperature": 0})
        assert first != greedy  # temperature 1 really samples


def render_default(messages: list[dict[str, str]]) -> str:
    """The default template, by hand: <|role|>\\ncontent\\n each, then <|assistant|>\\n."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


async def test_usage_counts_the_templated_prompt(llama: LiveServer) -> None:
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo wörld"}],
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c ☃"},
        ],
    ]
    for messages in conversations:
        expected = len(render_default(messages).encode())  # byte tokenizer: one token a byte
        tokenized = await post(llama.api + "/v1/tokenize", {"model": "tiny", "messages": messages})
        assert tokenized.doc["count"] == expected
        assert tokenized.doc["tokens"] == list(render_default(messages).encode())
        body = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}
        doc = (await post(llama.api + CHAT, body)).doc
        assert doc["usage"]["prompt_tokens"] == expected, messages
        total = doc["usage"]["prompt_tokens"] + doc["usage"]["completion_tokens"]
        assert doc["usage"]["total_tokens"] == total
        events = (await post(llama.api + CHAT, body | {"stream": True, "stream_options": {"include_usage": True}})).events  # fmt: skip
        assert events[-2]["usage"]["prompt_tokens"] == expected


def reference_embedding(tiny: TinyModels, ids: list[int]) -> np.ndarray:
    cfg, state = reference.state_from_hf(tiny.hf)
    _, hidden = reference.forward(cfg, state, ids)  # (T, d) final-normed
    mean = hidden.mean(axis=0)
    return np.asarray(mean / np.linalg.norm(mean))


async def test_embeddings_are_mean_pooled_and_normalized(
    llama: LiveServer, tiny: TinyModels
) -> None:
    inputs = ["hello", "a longer input, with more tokens in it", "é", "hello world"]
    expected = [reference_embedding(tiny, list(text.encode())) for text in inputs]
    body = {"model": "tiny", "input": inputs, "encoding_format": "float"}
    doc = (await post(llama.api + "/v1/embeddings", body)).doc
    assert doc["object"] == "list" and doc["model"] == "tiny"
    assert [d["index"] for d in doc["data"]] == list(range(len(inputs)))
    assert {d["object"] for d in doc["data"]} == {"embedding"}
    n_tokens = sum(len(text.encode()) for text in inputs)
    assert doc["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    floats = [np.asarray(d["embedding"]) for d in doc["data"]]
    for got, want in zip(floats, expected, strict=True):
        assert got.shape == (64,)
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5
        np.testing.assert_allclose(got, want, atol=2e-4)
    assert (
        min(np.abs(a - b).max() for i, a in enumerate(expected) for b in expected[i + 1 :]) > 1e-2
    )
    # base64: little-endian float32, the same vectors
    doc = (await post(llama.api + "/v1/embeddings", body | {"encoding_format": "base64"})).doc
    for d, got in zip(doc["data"], floats, strict=True):
        vector = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
        np.testing.assert_allclose(vector, got, atol=1e-6)
    # one string; token ids
    doc = (await post(llama.api + "/v1/embeddings", {"model": "tiny", "input": "é"})).doc
    np.testing.assert_allclose(doc["data"][0]["embedding"], expected[2], atol=2e-4)
    doc = (
        await post(llama.api + "/v1/embeddings", {"model": "tiny", "input": [list(b"hello")]})
    ).doc
    np.testing.assert_allclose(doc["data"][0]["embedding"], expected[0], atol=2e-4)


async def test_concurrent_streams_equal_serial(llama: LiveServer) -> None:
    prompts = [f"{p} #{i}" for i, p in enumerate(PROMPTS + ["x" * 70, "Z"])][:8]
    bodies = [chat(p, max_tokens=24 + 3 * i, temperature=0) for i, p in enumerate(prompts)]
    bodies += [chat(p, max_tokens=24, temperature=0.9, seed=i) for i, p in enumerate(prompts)]
    serial = [await whole(llama, CHAT, body) for body in bodies]
    for offset in (0, 8):  # eight greedy streams at once, then eight seeded ones
        batch = bodies[offset : offset + 8]
        parallel = await asyncio.gather(*(streamed(llama, CHAT, body) for body in batch))
        assert list(parallel) == serial[offset : offset + 8]
    everything = await asyncio.gather(*(streamed(llama, CHAT, body) for body in bodies))
    assert list(everything) == serial
    # they really run together (a batch per step, no request served to its end first):
    # every stream has its first token before any stream has its last
    long = [chat(p, max_tokens=400, temperature=0, ignore_eos=True) for p in prompts]
    spans = await asyncio.gather(*(stream_span(llama, body) for body in long))
    assert max(first for first, _ in spans) < min(last for _, last in spans), spans


async def stream_span(server: LiveServer, body: dict[str, Any]) -> tuple[float, float]:
    """When a stream's first token came (its headers wait for it) and when its [DONE] came."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.api + CHAT, json=body | {"stream": True}) as resp,
    ):
        first = time.monotonic()
        assert resp.status == 200
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")
        return first, time.monotonic()


async def test_speculative_runtime_config_drives_the_serving_path(
    llama: LiveServer, tiny: TinyModels, tmp_path: Any
) -> None:
    spec = {"speculative": "prompt_lookup", "spec_num_tokens": 4}
    repetitive = ["abcabcabcabcabcabc", "the cat the cat the cat the", "01010101010101"]
    engine = default_engine(tiny.hf, model_id="tiny", **spec)
    with live_server(tmp_path / "tiny-spec", engine) as fast:
        for prompt in [*repetitive, *PROMPTS[:3]]:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0}
            assert await whole(fast, COMPLETIONS, body) == await whole(llama, COMPLETIONS, body)
            assert await streamed(fast, COMPLETIONS, body) == await whole(llama, COMPLETIONS, body)
            body = chat(prompt, max_tokens=24, temperature=0)
            assert await whole(fast, CHAT, body) == await whole(llama, CHAT, body)
        samples = await metrics(fast.health)
        assert samples["tl_engine_spec_proposed_tokens_total"] > 0
    assert (await metrics(llama.health)).get("tl_engine_spec_proposed_tokens_total", 0) == 0
    # on succ, drafts from the prompt are right: they are accepted, and the answer is exact
    engine = default_engine(tiny.succ, model_id="succ", **spec)
    with live_server(tmp_path / "succ-spec", engine) as fast:
        body = {"model": "succ", "prompt": "fghijklmnop, fg", "max_tokens": 12, "temperature": 0}
        assert await whole(fast, COMPLETIONS, body) == ("hijklmnopqrs", "length", 12)
        stopped = await streamed(fast, COMPLETIONS, body | {"stop": ["mno"]})
        assert stopped[:2] == ("hijkl", "stop")  # a stop string inside one multi-token step
        samples = await metrics(fast.health)
        assert samples["tl_engine_spec_accepted_tokens_total"] > 0

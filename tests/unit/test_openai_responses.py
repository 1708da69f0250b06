"""Response and chunk documents: exact JSON shapes, parsed by the official openai types."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import msgspec
import pytest
from openai.types import Completion, CompletionUsage, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from frontend.openai.responses import (
    DetokenizeResponse,
    Head,
    ModelEntry,
    TokenizeResponse,
    chat_choice,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    chat_role_chunk,
    chat_usage_chunk,
    completion_logprobs,
    embedding_list,
    model_list,
    prompt_logprobs,
    text_choice,
    text_completion,
    text_usage_chunk,
    usage,
)
from shared.protocol import TokenLogprob, TopLogprob

HEAD = Head(id="chatcmpl-abc", created=1700000000, model="succ")


def wire(doc: object) -> Any:
    """The document as a client sees it: encoded, then parsed as plain JSON."""
    return msgspec.json.decode(msgspec.json.encode(doc))


def token_bytes(token_id: int) -> bytes:
    return {1: b"b", 2: b"cd", 3: "é".encode(), 4: b"\xe4"}[token_id]


USAGE_1_3 = {
    "prompt_tokens": 1,
    "completion_tokens": 3,
    "total_tokens": 4,
    "prompt_tokens_details": {"cached_tokens": 0},  # always there, as OpenAI sends it
}


def test_hand_example_chat_completion() -> None:
    doc = wire(chat_completion(HEAD, [chat_choice(0, "bcd", "length")], usage(1, 3)))
    assert doc == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "succ",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "bcd"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": USAGE_1_3,
    }
    parsed = ChatCompletion.model_validate(doc)
    assert parsed.choices[0].message.content == "bcd"
    assert parsed.usage is not None and parsed.usage.total_tokens == 4


def test_several_choices_carry_their_index() -> None:
    choices = [chat_choice(i, t, "stop") for i, t in enumerate(["a", "b"])]
    doc = wire(chat_completion(HEAD, choices, usage(1, 2)))
    assert [(c["index"], c["message"]["content"]) for c in doc["choices"]] == [(0, "a"), (1, "b")]
    assert ChatCompletion.model_validate(doc).choices[1].index == 1
    chunk = wire(chat_chunk(HEAD, "x", index=3, usage=usage(1, 3)))
    assert chunk["choices"][0]["index"] == 3 and chunk["usage"] == USAGE_1_3
    assert wire(chat_role_chunk(HEAD, 2))["choices"][0]["index"] == 2
    text = wire(text_completion(HEAD, [text_choice(i, "t", "stop") for i in range(2)]))
    assert [c.index for c in Completion.model_validate(text).choices] == [0, 1]


def test_chat_stream_chunks() -> None:
    chunks = [
        wire(chat_role_chunk(HEAD)),
        wire(chat_chunk(HEAD, "b")),
        wire(chat_chunk(HEAD, "cd", finish_reason="length")),
        wire(chat_chunk(HEAD, None, finish_reason="stop")),
        wire(chat_usage_chunk(HEAD, usage(1, 3))),
    ]
    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": ""},
        {"content": "b"},
        {"content": "cd"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, "length", "stop"]
    assert all("usage" not in c for c in chunks[:4])
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"] == USAGE_1_3
    assert {c["id"] for c in chunks} == {"chatcmpl-abc"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    text = "".join(p.choices[0].delta.content or "" for p in parsed[:4])
    assert text == "bcd"


def test_text_completion_and_chunks() -> None:
    head = Head(id="cmpl-1", created=5, model="succ")
    whole = wire(text_completion(head, [text_choice(0, "bcd", "stop")], usage(2, 3)))
    assert whole["object"] == "text_completion"
    assert whole["choices"] == [
        {"index": 0, "text": "bcd", "logprobs": None, "finish_reason": "stop"}
    ]
    Completion.model_validate(whole)
    middle = wire(text_completion(head, [text_choice(0, "b", None)]))
    assert middle["choices"][0]["finish_reason"] is None
    assert "usage" not in middle
    last = wire(text_completion(head, [text_choice(0, "cd", "length")]))
    assert Completion.model_validate(last).choices[0].finish_reason == "length"
    tail = wire(text_usage_chunk(head, usage(2, 3)))
    assert tail["choices"] == []
    assert Completion.model_validate(tail).usage == CompletionUsage.model_validate(
        {**USAGE_1_3, "prompt_tokens": 2, "total_tokens": 5}
    )


def test_usage_with_cached_tokens() -> None:
    doc = wire(usage(10, 2, cached_tokens=8))
    assert doc["prompt_tokens_details"] == {"cached_tokens": 8}
    parsed = CompletionUsage.model_validate(doc)
    assert parsed.prompt_tokens_details is not None
    assert parsed.prompt_tokens_details.cached_tokens == 8


ENTRIES = [
    TokenLogprob(1, -0.25, [TopLogprob(1, -0.25), TopLogprob(2, -1.5)]),
    TokenLogprob(3, -math.inf, [TopLogprob(4, -0.5)]),
]


def test_chat_logprobs_shape_and_client_parse() -> None:
    logprobs = chat_logprobs(ENTRIES, token_bytes)
    doc = wire(chat_completion(HEAD, [chat_choice(0, "bé", "stop", logprobs)], usage(1, 2)))
    content = doc["choices"][0]["logprobs"]["content"]
    assert content[0] == {
        "token": "b",
        "logprob": -0.25,
        "bytes": [98],
        "top_logprobs": [
            {"token": "b", "logprob": -0.25, "bytes": [98]},
            {"token": "cd", "logprob": -1.5, "bytes": [99, 100]},
        ],
    }
    assert content[1]["token"] == "é" and content[1]["bytes"] == [0xC3, 0xA9]
    assert content[1]["logprob"] == -9999.0  # -inf cannot go into JSON
    assert content[1]["top_logprobs"][0]["token"] == "\ufffd"  # a partial character
    parsed = ChatCompletion.model_validate(doc).choices[0].logprobs
    assert parsed is not None and parsed.content is not None
    assert parsed.content[0].top_logprobs[1].bytes == [99, 100]


def test_completion_logprobs_offsets() -> None:
    entries = [TokenLogprob(2, -0.1, [TopLogprob(2, -0.1), TopLogprob(1, -3.0)]), *ENTRIES]
    logprobs = completion_logprobs(entries, token_bytes, text_offset=4)
    choice = text_choice(0, "cdbé", "stop", logprobs)
    doc = wire(text_completion(Head("cmpl-1", 1, "m"), [choice]))
    assert doc["choices"][0]["logprobs"] == {
        "tokens": ["cd", "b", "é"],
        "token_logprobs": [-0.1, -0.25, -9999.0],
        "top_logprobs": [{"cd": -0.1, "b": -3.0}, {"b": -0.25, "cd": -1.5}, {"\ufffd": -0.5}],
        "text_offset": [4, 6, 7],
    }
    Completion.model_validate(doc)


def test_echoed_prompt_logprobs_start_with_a_token_that_has_none() -> None:
    """lm-eval-harness reads token_logprobs[ctxlen:-1] and compares each with its top's best."""
    logprobs = completion_logprobs(ENTRIES, token_bytes, first_token=2, top_n=1)
    doc = wire(
        text_completion(Head("cmpl-1", 1, "m"), [text_choice(0, "cdbé", "length", logprobs)])
    )
    got = doc["choices"][0]["logprobs"]
    assert got["tokens"] == ["cd", "b", "é"]
    assert got["token_logprobs"] == [None, -0.25, -9999.0]
    assert got["top_logprobs"] == [None, {"b": -0.25}, {"\ufffd": -0.5}]
    assert got["text_offset"] == [0, 2, 3]
    # (the openai client's types say float, but it builds responses without validating them:
    # the null of OpenAI's own echo reaches the caller; see the conformance tests)


def test_vllm_prompt_logprobs() -> None:
    entries = [TokenLogprob(2, -1.5, [TopLogprob(1, -0.25), TopLogprob(2, -1.5)], rank=2)]
    got = wire(prompt_logprobs(entries, token_bytes, 2))
    assert got == [
        None,
        {
            "2": {"logprob": -1.5, "rank": 2, "decoded_token": "cd"},
            "1": {"logprob": -0.25, "rank": 1, "decoded_token": "b"},
        },
    ]
    choice = wire(text_choice(0, "x", "stop", None, prompt_logprobs(entries, token_bytes, 0)))
    assert choice["prompt_logprobs"] == [
        None,
        {"2": {"logprob": -1.5, "rank": 2, "decoded_token": "cd"}},
    ]
    assert "prompt_logprobs" not in wire(text_choice(0, "x", "stop"))


VECTORS = [[0.6, -0.8, 0.0], [1.0, 0.1, 1e-7]]


def test_embeddings_float() -> None:
    doc = wire(embedding_list("succ", VECTORS, None, num_tokens=7))
    assert doc["object"] == "list"
    assert [d["index"] for d in doc["data"]] == [0, 1]
    assert {d["object"] for d in doc["data"]} == {"embedding"}
    assert doc["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    parsed = CreateEmbeddingResponse.model_validate(doc)
    assert [d.embedding for d in parsed.data] == VECTORS


def test_embeddings_base64_is_little_endian_float32() -> None:
    doc = wire(embedding_list("succ", VECTORS, "base64", num_tokens=7))
    for item, vector in zip(doc["data"], VECTORS, strict=True):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * len(vector)
        decoded = struct.unpack(f"<{len(vector)}f", raw)
        assert decoded == pytest.approx(vector, rel=1e-6, abs=1e-12)


def test_models_and_tokenize() -> None:
    entry = ModelEntry(id="succ", created=3, owned_by="tl-serve", max_model_len=64)
    doc = wire(model_list([entry]))
    assert doc == {
        "object": "list",
        "data": [
            {
                "id": "succ",
                "object": "model",
                "created": 3,
                "owned_by": "tl-serve",
                "max_model_len": 64,
            }
        ],
    }
    assert Model.model_validate(doc["data"][0]).id == "succ"
    assert wire(TokenizeResponse(tokens=[1, 2], count=2, max_model_len=64)) == {
        "tokens": [1, 2],
        "count": 2,
        "max_model_len": 64,
    }
    strs = TokenizeResponse(tokens=[1], count=1, max_model_len=64, token_strs=["Ġa"])
    assert wire(strs)["token_strs"] == ["Ġa"]
    assert wire(DetokenizeResponse(prompt="ab")) == {"prompt": "ab"}

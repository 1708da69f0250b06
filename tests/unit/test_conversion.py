"""Converter: a decoded OpenAI request becomes one GenerationJob (or token ids), checks in order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontend.openai.conversion import Converter, GenerationJob
from frontend.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    decode_request,
)
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError
from shared.protocol import SamplingParams, Welcome
from tests.conftest import TinyModels
from tests.fixtures.tiny_model import EOS

WELCOME = Welcome("succ", max_model_len=32, vocab_size=260, eos_ids=[EOS], block_size=4, core_pid=1)


@pytest.fixture(scope="module")
def model(tiny: TinyModels) -> ServedModel:
    return ServedModel.load(tiny.succ, "succ")  # its template: the contents, concatenated


def converter(model: ServedModel, welcome: Welcome | None = WELCOME) -> Converter:
    def require_welcome() -> Welcome:
        if welcome is None:
            raise ServingError(ErrorCode.ENGINE_UNAVAILABLE, "no core")
        return welcome

    return Converter(
        model, require_welcome, max_messages=2, max_embedding_inputs=3, max_embedding_tokens=40
    )


def chat(**fields: Any) -> ChatCompletionRequest:
    doc = {"model": "succ", "messages": [{"role": "user", "content": "ab"}], **fields}
    return decode_request(json.dumps(doc).encode(), ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    doc = {"model": "succ", "prompt": "abc", **fields}
    return decode_request(json.dumps(doc).encode(), CompletionRequest)


async def test_chat_becomes_one_job(model: ServedModel) -> None:
    req = chat(stop=["x"], stream=True, stream_options={"include_usage": True}, temperature=0)
    job = await converter(model).chat(req, {"X-TL-Priority": "5"})
    assert job == GenerationJob(
        chat=True,
        prompt_ids=[97, 98],
        params=SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(EOS,)),
        stops=["x"],
        priority=5,
        stream=True,
        include_usage=True,
        param="messages",
    )


async def test_completion_of_text_and_of_token_ids(model: ServedModel) -> None:
    job = await converter(model).completion(completion(), {})
    assert (job.chat, job.prompt_ids, job.params.max_tokens, job.param) == (
        False,
        [97, 98, 99],
        16,  # a completion's default
        "prompt",
    )
    ids = await converter(model).completion(completion(prompt=[1, 2], max_tokens=3), {})
    assert (ids.prompt_ids, ids.params.max_tokens, ids.stream) == ([1, 2], 3, False)
    with pytest.raises(ServingError, match="below 260") as refused:
        await converter(model).completion(completion(prompt=[1, 260]), {})
    assert refused.value.param == "prompt"


@pytest.mark.parametrize(
    ("req", "headers", "welcome", "code", "param"),
    [
        # the document first: a bad value wins over a missing core and a bad header
        (chat(temperature=3), {"X-TL-Priority": "x"}, None, "invalid_value", "temperature"),
        (
            chat(messages=[{"role": "user", "content": "a"}] * 3),
            {},
            None,
            "invalid_value",
            "messages",
        ),
        # then the model and the headers, before the core
        (chat(model="other"), {}, None, "model_not_found", "model"),
        (chat(), {"X-TL-Priority": "101"}, None, "invalid_value", "X-TL-Priority"),
        (chat(), {"X-TL-KV-Handle": "h"}, None, "kv_handle_not_found", "X-TL-KV-Handle"),
        (chat(), {}, None, "engine_unavailable", None),
        # then the prompt against the context
        (chat(max_tokens=31), {}, WELCOME, "context_length_exceeded", "messages"),
        (
            chat(messages=[{"role": "user", "content": ""}]),
            {},
            WELCOME,
            "invalid_value",
            "messages",
        ),
    ],
)
async def test_refusals_come_in_order(
    model: ServedModel,
    req: ChatCompletionRequest,
    headers: dict[str, str],
    welcome: Welcome | None,
    code: str,
    param: str | None,
) -> None:
    with pytest.raises(ServingError) as refused:
        await converter(model, welcome).chat(req, headers)
    assert (refused.value.code, refused.value.param) == (code, param)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["a", "b", "c", "d"], "'input' has 4 inputs; at most 3."),  # before any tokenizing
        (["a" * 20, "b" * 20, "c"], "'input' has more than 40 tokens in all."),
        ([[1] * 30, [2] * 11], "'input' has more than 40 tokens in all."),
    ],
)
async def test_embedding_limits_are_400s(
    model: ServedModel, inputs: list[Any], message: str
) -> None:
    req = decode_request(json.dumps({"model": "succ", "input": inputs}).encode(), EmbeddingRequest)
    with pytest.raises(ServingError) as refused:
        await converter(model).embeddings(req)
    error = refused.value
    assert (error.http_status, error.code, error.param, error.message) == (
        400,
        "invalid_value",
        "input",
        message,
    )
    fits = decode_request(
        json.dumps({"model": "succ", "input": ["a" * 20, "b" * 20]}).encode(), EmbeddingRequest
    )
    assert len(await converter(model).embeddings(fits)) == 2


async def test_embedding_inputs_and_tokenize(model: ServedModel) -> None:
    doc = {"model": "succ", "input": ["ab", "c"]}
    req = decode_request(json.dumps(doc).encode(), EmbeddingRequest)
    assert await converter(model).embeddings(req) == [[97, 98], [99]]
    doc = {"model": "succ", "input": [[5, 6, 7]]}
    req = decode_request(json.dumps(doc).encode(), EmbeddingRequest)
    assert await converter(model).embeddings(req) == [[5, 6, 7]]
    long = decode_request(
        json.dumps({"model": "succ", "input": "a" * 33}).encode(), EmbeddingRequest
    )
    with pytest.raises(ServingError) as refused:
        await converter(model).embeddings(long)
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "input")
    messages = {
        "model": "succ",
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    }
    tokens, welcome = await converter(model).tokenize(
        decode_request(json.dumps(messages).encode(), TokenizeRequest)
    )
    assert (tokens, welcome) == ([97, 98], WELCOME)

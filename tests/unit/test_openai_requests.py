"""decode_request: OpenAI bodies into Structs, schema problems into pinned 400 errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontend.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TextPart,
    TokenizeRequest,
    decode_request,
)
from shared.errors import ErrorCode, ServingError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(base: dict[str, Any], **changes: Any) -> bytes:
    doc = {**base, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


MISSING = ErrorCode.MISSING_REQUIRED_PARAMETER
INVALID = ErrorCode.INVALID_VALUE


@pytest.mark.parametrize(
    ("kind", "raw", "code", "param"),
    [
        (ChatCompletionRequest, b'{"model": "m", "messages": [', ErrorCode.INVALID_JSON, None),
        (ChatCompletionRequest, b"", ErrorCode.INVALID_JSON, None),
        (ChatCompletionRequest, b"[1, 2]", INVALID, None),
        (ChatCompletionRequest, body(CHAT, model=...), MISSING, "model"),
        (ChatCompletionRequest, body(CHAT, model=None), MISSING, "model"),
        (ChatCompletionRequest, body(CHAT, messages=...), MISSING, "messages"),
        (ChatCompletionRequest, body(CHAT, messages=[]), MISSING, "messages"),
        (ChatCompletionRequest, body(CHAT, model=7), INVALID, "model"),
        (ChatCompletionRequest, body(CHAT, temperature="hot"), INVALID, "temperature"),
        (ChatCompletionRequest, body(CHAT, temperature=True), INVALID, "temperature"),
        (ChatCompletionRequest, body(CHAT, max_tokens=1.5), INVALID, "max_tokens"),
        (ChatCompletionRequest, body(CHAT, stream="yes"), INVALID, "stream"),
        (ChatCompletionRequest, body(CHAT, stop=[1]), INVALID, "stop[0]"),
        (ChatCompletionRequest, body(CHAT, stop=5), INVALID, "stop"),
        (ChatCompletionRequest, body(CHAT, logit_bias={"1": "x"}), INVALID, "logit_bias"),
        (
            ChatCompletionRequest,
            body(CHAT, stream_options={"include_usage": "y"}),
            INVALID,
            "stream_options.include_usage",
        ),
        (
            ChatCompletionRequest,
            body(CHAT, messages=[{"content": "x"}]),
            MISSING,
            "messages[0].role",
        ),
        (
            ChatCompletionRequest,
            body(CHAT, messages=[{"role": "user", "content": 5}]),
            INVALID,
            "messages[0].content",
        ),
        (
            ChatCompletionRequest,
            body(CHAT, messages=[{"role": "user", "content": [{"text": "x"}]}]),
            MISSING,
            "messages[0].content[0].type",
        ),
        (ChatCompletionRequest, b'{"model": "m", "temperature": 1e400}', INVALID, "temperature"),
        (CompletionRequest, body({"model": "m"}), MISSING, "prompt"),
        (CompletionRequest, body({"model": "m", "prompt": {}}), INVALID, "prompt"),
        (
            CompletionRequest,
            body({"model": "m", "prompt": "x", "logprobs": True}),
            INVALID,
            "logprobs",
        ),
        (EmbeddingRequest, body({"model": "m"}), MISSING, "input"),
        (EmbeddingRequest, body({"model": "m", "input": None}), MISSING, "input"),
        (EmbeddingRequest, body({"model": "m", "input": [[1, "a"]]}), INVALID, "input[0][1]"),
        (TokenizeRequest, body({"prompt": "x"}), MISSING, "model"),
    ],
)
def test_decode_errors(kind: type[Any], raw: bytes, code: ErrorCode, param: str | None) -> None:
    with pytest.raises(ServingError) as info:
        decode_request(raw, kind)
    assert (info.value.code, info.value.param) == (code, param)
    assert info.value.http_status == 400
    doc = info.value.to_document()["error"]
    assert doc["type"] == "invalid_request_error"
    assert doc["message"]


def test_chat_decodes_and_ignores_unknown_fields() -> None:
    raw = body(
        CHAT,
        messages=[
            {"role": "system", "content": "be brief", "extra": 1},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        temperature=0,
        stop="\n",
        stream_options={"include_usage": True},
        some_future_field={"nested": [1, 2]},
    )
    req = decode_request(raw, ChatCompletionRequest)
    assert req.model == "m"
    assert req.temperature == 0.0
    assert req.stop == "\n"
    assert req.stream_options is not None and req.stream_options.include_usage
    assert req.messages[1].content == [TextPart(type="text", text="hi")]
    assert req.max_tokens is None and req.n is None  # absent -> None, defaults come later


@pytest.mark.parametrize("prompt", ["text", ["text"], [1, 2, 3], [[1, 2]], ["a", "b"], [[1], [2]]])
def test_completion_prompt_shapes_decode(prompt: object) -> None:
    raw = json.dumps({"model": "m", "prompt": prompt}).encode()
    assert decode_request(raw, CompletionRequest).prompt == prompt


@pytest.mark.parametrize("value", ["text", ["a", "b"], [1, 2], [[1], [2, 3]]])
def test_embedding_input_shapes_decode(value: object) -> None:
    raw = json.dumps({"model": "m", "input": value, "encoding_format": "base64"}).encode()
    req = decode_request(raw, EmbeddingRequest)
    assert (req.input, req.encoding_format) == (value, "base64")


def test_tokenize_decodes_messages() -> None:
    raw = body({"model": "m"}, messages=CHAT["messages"], add_special_tokens=False)
    req = decode_request(raw, TokenizeRequest)
    assert req.prompt is None
    assert req.messages is not None and req.messages[0].role == "user"
    assert req.add_special_tokens is False

"""Request checks (400 / 422 with the pinned params) and translation to SamplingParams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontend.openai.conversion import (
    requested_max_tokens,
    stop_strings,
    template_messages,
    to_sampling_params,
)
from frontend.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    decode_request,
)
from frontend.openai.validation import (
    completion_prompts,
    embedding_inputs,
    parse_priority,
    validate_chat,
    validate_completion,
    validate_embedding,
    validate_tokenize,
)
from shared.errors import ErrorCode, ServingError
from shared.protocol import SamplingParams

USER = {"role": "user", "content": "hi"}
INVALID = (400, ErrorCode.INVALID_VALUE)
UNSUPPORTED = (422, ErrorCode.UNSUPPORTED_PARAMETER)
MISSING = (400, ErrorCode.MISSING_REQUIRED_PARAMETER)


def chat(**fields: Any) -> ChatCompletionRequest:
    doc = {"model": "m", "messages": [USER], **fields}
    return decode_request(json.dumps(doc).encode(), ChatCompletionRequest)


def completion(**fields: Any) -> CompletionRequest:
    doc = {"model": "m", "prompt": "hi", **fields}
    return decode_request(json.dumps(doc).encode(), CompletionRequest)


def embedding(**fields: Any) -> EmbeddingRequest:
    doc = {"model": "m", "input": "hi", **fields}
    return decode_request(json.dumps(doc).encode(), EmbeddingRequest)


def expect(err: ServingError, kind: tuple[int, ErrorCode], param: str) -> None:
    assert (err.http_status, err.code, err.param) == (*kind, param)


@pytest.mark.parametrize(
    ("fields", "kind", "param"),
    [
        ({"temperature": -0.1}, INVALID, "temperature"),
        ({"temperature": 2.01}, INVALID, "temperature"),
        ({"top_p": 0}, INVALID, "top_p"),
        ({"top_p": 1.5}, INVALID, "top_p"),
        ({"top_k": -2}, INVALID, "top_k"),
        ({"min_p": 1.5}, INVALID, "min_p"),
        ({"max_tokens": 0}, INVALID, "max_tokens"),
        ({"max_completion_tokens": 0}, INVALID, "max_completion_tokens"),
        ({"presence_penalty": 2.5}, INVALID, "presence_penalty"),
        ({"frequency_penalty": -2.5}, INVALID, "frequency_penalty"),
        ({"repetition_penalty": 0}, INVALID, "repetition_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, INVALID, "stop"),
        ({"stop_token_ids": [-1]}, INVALID, "stop_token_ids"),
        ({"logprobs": True, "top_logprobs": 21}, INVALID, "top_logprobs"),
        ({"top_logprobs": 2}, INVALID, "top_logprobs"),
        ({"n": 0}, INVALID, "n"),
        ({"n": 129}, INVALID, "n"),
        ({"echo": True}, UNSUPPORTED, "echo"),
        ({"tools": [{"type": "function"}]}, UNSUPPORTED, "tools"),
        ({"tool_choice": "auto"}, UNSUPPORTED, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, UNSUPPORTED, "response_format"),
        ({"logit_bias": {"5": 100.5}}, INVALID, "logit_bias"),
        ({"logit_bias": {"a": 1.0}}, INVALID, "logit_bias"),
        ({"logit_bias": {"-1": 1.0}}, INVALID, "logit_bias"),
        ({"min_tokens": -1}, INVALID, "min_tokens"),
        ({"priority": 101}, INVALID, "priority"),
        ({"cache_salt": ""}, INVALID, "cache_salt"),
        ({"prompt_logprobs": 21}, INVALID, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, INVALID, "prompt_logprobs"),
        ({"chat_template_kwargs": {"messages": []}}, INVALID, "chat_template_kwargs"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, INVALID, "messages[0].role"),
        ({"messages": [USER, {"role": "user"}]}, MISSING, "messages[1].content"),
        (
            {"messages": [USER, {"role": "user", "content": [{"type": "image_url"}]}]},
            UNSUPPORTED,
            "messages[1].content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            MISSING,
            "messages[0].content[0].text",
        ),
    ],
)
def test_chat_rejections(fields: dict[str, Any], kind: tuple[int, ErrorCode], param: str) -> None:
    with pytest.raises(ServingError) as info:
        validate_chat(chat(**fields))
    expect(info.value, kind, param)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 0},
        {"stop": ["a", "b", "c", "d"]},
        {"stop": "x", "n": 1, "echo": False, "tools": None, "tool_choice": None},
        {"logprobs": True, "top_logprobs": 20, "max_completion_tokens": 1},
        {"presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {}},
        {"n": 128, "logit_bias": {"5": -100, "0": 100}, "min_tokens": 0, "priority": -100},
        {"cache_salt": "s", "prompt_logprobs": 20, "chat_template_kwargs": {"think": True}},
        {"skip_special_tokens": False, "include_stop_str_in_output": True},
        {"messages": [{"role": r, "content": "x"} for r in ("system", "developer", "tool")]},
        {"messages": [USER, {"role": "assistant", "content": None}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
    ],
)
def test_chat_accepts(fields: dict[str, Any]) -> None:
    validate_chat(chat(**fields))


@pytest.mark.parametrize(
    ("fields", "kind", "param"),
    [
        ({"prompt": ["a", ""]}, INVALID, "prompt[1]"),
        ({"prompt": [[1], [-2]]}, INVALID, "prompt[1]"),
        ({"prompt": ["a"] * 257}, INVALID, "prompt"),
        ({"prompt": ["a", 1]}, INVALID, "prompt"),
        ({"prompt": []}, INVALID, "prompt"),
        ({"prompt": ""}, INVALID, "prompt"),
        ({"prompt": [[]]}, INVALID, "prompt[0]"),
        ({"prompt": [1, -1]}, INVALID, "prompt"),
        ({"max_tokens": 0}, INVALID, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, INVALID, "max_tokens"),
        ({"logprobs": 21}, INVALID, "logprobs"),
        ({"temperature": 3}, INVALID, "temperature"),
        ({"stop": ["1", "2", "3", "4", "5"]}, INVALID, "stop"),
        ({"suffix": "tail"}, UNSUPPORTED, "suffix"),
        ({"best_of": 3}, UNSUPPORTED, "best_of"),
        ({"n": 0}, INVALID, "n"),
    ],
)
def test_completion_rejections(
    fields: dict[str, Any], kind: tuple[int, ErrorCode], param: str
) -> None:
    with pytest.raises(ServingError) as info:
        validate_completion(completion(**fields))
    expect(info.value, kind, param)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hi", ["hi"]),
        (["hi"], ["hi"]),
        ([1, 2], [[1, 2]]),
        ([[3, 4]], [[3, 4]]),
        ([0], [[0]]),
        (["a", "b"], ["a", "b"]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_completion_prompts(prompt: object, expected: object) -> None:
    req = completion(prompt=prompt)
    validate_completion(req)
    assert completion_prompts(req) == expected


def test_echo_allows_max_tokens_0() -> None:
    validate_completion(completion(echo=True, max_tokens=0, logprobs=1))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_embedding_inputs(value: object, expected: list[object]) -> None:
    req = embedding(input=value)
    validate_embedding(req)
    assert embedding_inputs(req) == expected


@pytest.mark.parametrize(
    ("fields", "kind", "param"),
    [
        ({"input": []}, INVALID, "input"),
        ({"input": ""}, INVALID, "input"),
        ({"input": ["a", ""]}, INVALID, "input[1]"),
        ({"input": ["a", [1]]}, INVALID, "input"),
        ({"input": [[1], "a"]}, INVALID, "input"),
        ({"input": [[1], [-2]]}, INVALID, "input[1]"),
        ({"encoding_format": "hex"}, INVALID, "encoding_format"),
        ({"dimensions": 64}, UNSUPPORTED, "dimensions"),
    ],
)
def test_embedding_rejections(
    fields: dict[str, Any], kind: tuple[int, ErrorCode], param: str
) -> None:
    with pytest.raises(ServingError) as info:
        validate_embedding(embedding(**fields))
    expect(info.value, kind, param)


@pytest.mark.parametrize(
    ("doc", "kind", "param"),
    [
        ({"model": "m"}, MISSING, "prompt"),
        ({"model": "m", "prompt": "x", "messages": [USER]}, INVALID, "messages"),
        ({"model": "m", "messages": []}, MISSING, "messages"),
        (
            {"model": "m", "messages": [{"role": "bot", "content": "x"}]},
            INVALID,
            "messages[0].role",
        ),
    ],
)
def test_tokenize_rejections(doc: dict[str, Any], kind: tuple[int, ErrorCode], param: str) -> None:
    req = decode_request(json.dumps(doc).encode(), TokenizeRequest)
    with pytest.raises(ServingError) as info:
        validate_tokenize(req)
    expect(info.value, kind, param)


def test_template_messages_join_text_parts() -> None:
    req = chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert template_messages(req.messages) == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(("stop", "expected"), [(None, []), ("x", ["x"]), (["a", ""], ["a"])])
def test_stop_strings(stop: object, expected: list[str]) -> None:
    assert stop_strings(chat(stop=stop)) == expected


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (chat(), None),
        (chat(max_tokens=5), 5),
        (chat(max_tokens=5, max_completion_tokens=7), 7),
        (completion(), 16),
        (completion(max_tokens=3), 3),
    ],
)
def test_requested_max_tokens(
    req: ChatCompletionRequest | CompletionRequest, expected: int
) -> None:
    assert requested_max_tokens(req) == expected


def test_sampling_params_defaults() -> None:
    params = to_sampling_params(chat(), 100, [2, 0])
    assert params == SamplingParams(max_tokens=100, stop_token_ids=(2, 0))


def test_sampling_params_carry_every_field() -> None:
    req = chat(
        temperature=0, top_p=0.5, top_k=7, min_p=0.1, seed=-1, presence_penalty=0.5,
        frequency_penalty=-0.5, repetition_penalty=1.2, stop_token_ids=[9, 2],
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    params = to_sampling_params(req, 10, [2])
    assert params == SamplingParams(
        max_tokens=10, temperature=0.0, top_p=0.5, top_k=7, min_p=0.1, seed=2**64 - 1,
        presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        stop_token_ids=(2, 9), ignore_eos=False, logprobs=3,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("req", "logprobs"),
    [
        (chat(logprobs=True), 0),
        (chat(logprobs=False), None),
        (chat(), None),
        (completion(logprobs=2), 2),
        (completion(logprobs=0), 0),
        (completion(), None),
    ],
)
def test_sampling_params_logprobs(
    req: ChatCompletionRequest | CompletionRequest, logprobs: int | None
) -> None:
    assert to_sampling_params(req, 1, [0]).logprobs == logprobs


def test_ignore_eos_drops_eos_but_keeps_explicit_stop_ids() -> None:
    params = to_sampling_params(completion(ignore_eos=True, stop_token_ids=[5], top_k=-1), 4, [0])
    assert (params.ignore_eos, params.stop_token_ids, params.top_k) == (True, (5,), 0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), ("5", 5), ("-100", -100), ("100", 100), (" 7 ", 7), ("+3", 3)]
    + [(bad, None) for bad in ["101", "-101", "abc", "1.5", "", "1_0", "99999999999999"]],
)
def test_parse_priority(value: str | None, expected: int | None) -> None:
    if expected is not None:
        assert parse_priority(value) == expected
        return
    with pytest.raises(ServingError) as info:
        parse_priority(value)
    expect(info.value, INVALID, "X-TL-Priority")

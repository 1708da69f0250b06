"""Converter: a decoded OpenAI request becomes one GenerationJob (or token ids), checks in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from frontend.openai.conversion import Converter, GenerationJob, Prompt
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
from tests.fixtures.vocab_gguf import write_vocab_gguf

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
        prompts=[Prompt([97, 98], "ab")],
        n=1,
        params=SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(EOS,)),
        stops=["x"],
        priority=5,
        cache_salt="",
        stream=True,
        include_usage=True,
        continuous_usage=False,
        echo=False,
        include_stop=False,
        skip_special_tokens=True,
        prompt_logprobs=None,
        param="messages",
    )


async def test_completion_of_text_and_of_token_ids(model: ServedModel) -> None:
    job = await converter(model).completion(completion(), {})
    assert (job.chat, job.prompts, job.params.max_tokens, job.param) == (
        False,
        [Prompt([97, 98, 99], "abc")],
        16,  # a completion's default
        "prompt",
    )
    ids = await converter(model).completion(completion(prompt=[1, 2], max_tokens=3), {})
    assert (ids.prompts[0].ids, ids.params.max_tokens, ids.stream) == ([1, 2], 3, False)
    with pytest.raises(ServingError, match="below 260") as refused:
        await converter(model).completion(completion(prompt=[1, 260]), {})
    assert refused.value.param == "prompt"
    with pytest.raises(ServingError, match="below 260") as refused:
        await converter(model).completion(completion(prompt=[[1], [1, 260]]), {})
    assert refused.value.param == "prompt[1]"


async def test_several_prompts_choices_and_vllm_extras(model: ServedModel) -> None:
    req = completion(
        prompt=["ab", "c"],
        n=3,
        echo=True,
        logprobs=2,
        prompt_logprobs=4,
        min_tokens=2,
        max_tokens=5,
        logit_bias={"97": -100, "5": 2.5},
        cache_salt="s",
        priority=7,  # vLLM's: lower first
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    job = await converter(model).completion(req, {})
    assert job.prompts == [Prompt([97, 98], "ab"), Prompt([99], "c")]
    assert (job.n, job.num_choices, job.priority, job.cache_salt) == (3, 6, -7, "s")
    assert (job.echo, job.include_stop, job.skip_special_tokens) == (True, True, False)
    p = job.params
    assert (p.min_tokens, p.logit_bias, p.logprobs, p.prompt_logprobs) == (
        2,
        {97: -100.0, 5: 2.5},
        2,
        4,  # echo's logprobs and vLLM's prompt_logprobs: the larger
    )
    assert job.prompt_logprobs == 4
    # the header wins over the body
    assert (await converter(model).completion(req, {"X-TL-Priority": "3"})).priority == 3
    with pytest.raises(ServingError) as refused:
        await converter(model).completion(completion(logit_bias={"260": 1}), {})
    assert (refused.value.code, refused.value.param) == ("invalid_value", "logit_bias")
    with pytest.raises(ServingError) as refused:
        await converter(model).completion(completion(min_tokens=4, max_tokens=3), {})
    assert refused.value.param == "min_tokens"
    scored = await converter(model).completion(completion(echo=True, max_tokens=0), {})
    assert scored.params.max_tokens == 0


async def test_template_gets_names_kwargs_and_developer_as_system(model: ServedModel) -> None:
    template = (
        "{% for m in messages %}{{ m.role }}:{{ m.name }}:{{ m.content }}|{% endfor %}{{ flag }}"
    )
    custom = ServedModel(model.model_ids, model.tokenizer, type(model.template)(template, "", ""))
    messages = [
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "u", "name": "ann"},
    ]
    req = chat(messages=messages, chat_template_kwargs={"flag": "F"})
    job = await converter(custom).chat(req, {})
    assert job.prompts[0].text == "system::d|user:ann:u|F"


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


async def test_a_chat_template_from_the_config(tiny: TinyModels, tmp_path: Path) -> None:
    inline = "{% for m in messages %}<{{ m.content }}>{% endfor %}"
    (tmp_path / "t.jinja").write_text("{% for m in messages %}({{ m.content }}){% endfor %}")
    for setting, text in ((inline, "<ab>"), (str(tmp_path / "t.jinja"), "(ab)"), ("", "ab")):
        served = ServedModel.load(tiny.succ, ("succ", "alias"), setting)
        job = await converter(served).chat(chat(model="alias"), {})
        assert job.prompts[0].text == text
    with pytest.raises(FileNotFoundError):
        ServedModel.load(tiny.succ, "succ", str(tmp_path / "missing.jinja"))


def test_a_configured_template_replaces_the_models_tool_use_one_too(tmp_path: Path) -> None:
    templates = {"tokenizer.chat_template": "D", "tokenizer.chat_template.tool_use": "T"}
    path = write_vocab_gguf(tmp_path / "t.gguf", "gpt2", ["a"], [1], merges=[], **templates)
    tools: list[dict[str, object]] = [{"type": "function", "function": {"name": "f"}}]
    own = ServedModel.load(path, "m").template
    assert (own.render([], True), own.render([], True, tools=tools)) == ("D", "T")
    configured = ServedModel.load(path, "m", "{{ 'O' }}").template
    assert (configured.render([], True), configured.render([], True, tools=tools)) == ("O", "O")

"""Tool calling through a template that speaks Hermes-style `<tool_call>` (Qwen2.5's, from
llama.cpp's models/templates): a tiny model that writes the tag itself, the official client.

`auto` leaves the model free: it writes `<tool_call>` and the parser extracts the call, whose
name and arguments the grammar shapes; with tool_choice "none" the tag is only text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.conftest import llama_cpp_template
from tests.fixtures import tool_model
from tests.fixtures.live_server import default_engine, live_server

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": ARGS}},
    {"type": "function", "function": {"name": "lookup_time", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]  # fmt: skip
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def caller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    model = tool_model.write(
        tmp_path_factory.mktemp("caller"), llama_cpp_template("Qwen-Qwen2.5-7B-Instruct")
    )
    engine = default_engine(model, model_id="caller")
    with live_server(tmp_path_factory.mktemp("serve"), engine) as server:
        client = openai.OpenAI(base_url=server.api + "/v1", api_key="unused", max_retries=0)
        yield client
        client.close()


def create(client: openai.OpenAI, **fields: Any) -> Any:
    fields = {"messages": ASK, "temperature": 0, "max_tokens": 120} | fields
    return client.chat.completions.create(model="caller", **fields)


def test_auto_extracts_the_call_the_model_writes(caller: openai.OpenAI) -> None:
    reply = create(caller, tools=TOOLS, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # the tag never shows as text
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    # the name is the grammar's choice: succ's own successor of '"' is no name's first letter,
    # so greedy takes the lowest allowed token, "g"
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), ARGS)


def test_streamed_auto_assembles_to_the_same_call(caller: openai.OpenAI) -> None:
    whole = create(caller, tools=TOOLS, parallel_tool_calls=False).choices[0].message.tool_calls
    content, deltas = "", []
    for chunk in create(caller, tools=TOOLS, parallel_tool_calls=False, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            deltas += choice.delta.tool_calls or []
    assert "<" not in content
    assert [d.function.name for d in deltas if d.function.name] == [whole[0].function.name]
    assert "".join(d.function.arguments or "" for d in deltas) == whole[0].function.arguments
    with caller.chat.completions.stream(
        model="caller", messages=ASK, temperature=0, max_tokens=120, tools=TOOLS,
        parallel_tool_calls=False,
    ) as stream:  # fmt: skip
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (
        whole[0].function.name,
        whole[0].function.arguments,
    )


def test_none_leaves_the_tag_as_text_and_a_second_turn_renders(caller: openai.OpenAI) -> None:
    reply = create(caller, tools=TOOLS, tool_choice="none", max_tokens=12)
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content.startswith("<tool_call>")
    call = create(caller, tools=TOOLS, parallel_tool_calls=False).choices[0].message.tool_calls[0]
    history: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = create(caller, messages=history, tools=TOOLS, parallel_tool_calls=False)
    assert (
        second.usage.prompt_tokens > create(caller, tools=TOOLS, max_tokens=1).usage.prompt_tokens
    )
    assert second.choices[0].finish_reason == "tool_calls"


def test_required_and_named_force_calls(caller: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        reply = create(caller, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
        (call,) = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls"
        if choice is named:
            assert call.function.name == "get_weather"
        json.loads(call.function.arguments)

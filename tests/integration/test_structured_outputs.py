"""Structured outputs and tool calls with the official `openai` client, against a live server on
the bundled model (SmolLM2-135M, whose template speaks no tool-call format: the JSON form).

Every reply is checked by an independent validator (jsonschema, re), streamed and not; the
requests of a test run concurrently, as a client's would.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.fixtures.live_server import LiveServer, default_engine, live_server, metrics
from tests.fixtures.schemas import CASES, Case

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

MODEL = "smol"
FORMATS = jsonschema.FormatChecker()
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                      "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "strict": True,
                                      "parameters": {"type": "object", "additionalProperties": False,
                                                     "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                                                    "b": {"type": "integer", "minimum": -99, "maximum": 99}},
                                                     "required": ["a", "b"]}}},
]  # fmt: skip
ARGUMENTS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = default_engine(bundled_model, model_id=MODEL, num_threads=0)
    with live_server(tmp_path_factory.mktemp("structured"), engine) as live:
        yield live


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.api + "/v1", api_key="unused", max_retries=0, timeout=300
    ) as c:
        yield c


def ask(content: str) -> Any:
    return [{"role": "user", "content": content}]


async def reply_text(client: openai.AsyncOpenAI, stream: bool, **fields: Any) -> tuple[str, str]:
    """The content and finish reason of one chat request, streamed or not."""
    fields = {"model": MODEL, "temperature": 0, "max_tokens": 300} | fields
    if not stream:
        reply = await client.chat.completions.create(**fields)
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    content, finish = "", ""
    async for chunk in await client.chat.completions.create(stream=True, **fields):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return content, finish


def schema_format(case: Case) -> Any:
    name = re.sub(r"\W", "_", case.name)
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": case.schema, "strict": True},
    }


async def test_json_schema_replies_validate_streamed_and_not(client: openai.AsyncOpenAI) -> None:
    assert len(CASES) >= 20
    jobs = [
        reply_text(client, stream, messages=ask(case.prompt), response_format=schema_format(case))
        for case in CASES
        for stream in (False, True)
    ]
    replies = await asyncio.gather(*jobs)
    for i, case in enumerate(CASES):
        (whole, finish), (streamed, streamed_finish) = replies[2 * i], replies[2 * i + 1]
        assert (finish, streamed_finish) == ("stop", "stop"), (case.name, whole)
        jsonschema.validate(json.loads(whole), case.schema, format_checker=FORMATS)
        assert streamed == whole, case.name


async def test_json_object_replies_parse(client: openai.AsyncOpenAI) -> None:
    prompts = ["Describe a cat as JSON.", "Give me a JSON object with a name.", "Reply in JSON."]
    replies = await asyncio.gather(*(
        reply_text(client, stream, messages=ask(p), response_format={"type": "json_object"}, max_tokens=200)
        for p in prompts for stream in (False, True)
    ))  # fmt: skip
    for (text, finish), (streamed, _) in zip(replies[::2], replies[1::2], strict=True):
        if finish == "stop":
            assert isinstance(json.loads(text), dict)
        assert streamed == text


async def test_regex_and_choice_outputs_match(client: openai.AsyncOpenAI) -> None:
    phone = r"\(\d{3}\) \d{3}-\d{4}"
    jobs = []
    for stream in (False, True):
        jobs.append(reply_text(client, stream, messages=ask("A phone number?"),
                               extra_body={"structured_outputs": {"regex": phone}}))  # fmt: skip
        jobs.append(reply_text(client, stream, messages=ask("Is the sky blue?"),
                               extra_body={"guided_choice": ["yes", "no", "maybe"]}))  # fmt: skip
    (p1, f1), (c1, g1), (p2, _), (c2, _) = await asyncio.gather(*jobs)
    assert re.fullmatch(phone, p1) and p2 == p1 and f1 == "stop"
    assert c1 in ("yes", "no", "maybe") and c2 == c1 and g1 == "stop"
    completion = await client.completions.create(
        model=MODEL, prompt="The year the Berlin wall fell:", max_tokens=10, temperature=0,
        extra_body={"guided_regex": "[12][0-9]{3}"},
    )  # fmt: skip
    assert re.fullmatch("[12][0-9]{3}", completion.choices[0].text)
    assert completion.choices[0].finish_reason == "stop"


class Planet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    moons: int = pydantic.Field(ge=0, le=200)
    kind: Literal["rocky", "gas giant", "ice giant"]


class Planets(pydantic.BaseModel):
    planets: list[Planet] = pydantic.Field(min_length=1, max_length=3)


async def test_parse_with_a_pydantic_model(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.parse(
        model=MODEL, messages=ask("Name a planet and its moons."), temperature=0,
        max_tokens=300, response_format=Planets,
    )  # fmt: skip
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Planets) and parsed.planets
    with pytest.raises(openai.LengthFinishReasonError):
        await client.chat.completions.parse(
            model=MODEL, messages=ask("Name a planet."), max_tokens=3, response_format=Planets
        )


def check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, ARGUMENTS[call.function.name])


async def streamed_calls(client: openai.AsyncOpenAI, **fields: Any) -> tuple[list[Any], str]:
    """Tool calls assembled from a stream as the client's own stream() helper does."""
    async with client.chat.completions.stream(model=MODEL, temperature=0, **fields) as stream:
        final = await stream.get_final_completion()
    return list(final.choices[0].message.tool_calls or []), final.choices[0].finish_reason


async def test_required_and_named_tool_calls_parse(client: openai.AsyncOpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "add"}}
    asks = [("What is the weather in Paris?", "required", {"get_weather", "add"}),
            ("What is 2 plus 3?", named, {"add"})]  # fmt: skip
    for content, choice, names in asks:
        fields = {"messages": ask(content), "tools": TOOLS, "tool_choice": choice,
                  "parallel_tool_calls": False, "max_tokens": 200}  # fmt: skip
        reply = await client.chat.completions.create(model=MODEL, temperature=0, **fields)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
        check_calls(list(message.tool_calls or []), names)
        calls, finish = await streamed_calls(client, **fields)
        assert finish == "tool_calls"
        check_calls(calls, names)
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            (c.function.name, c.function.arguments) for c in message.tool_calls or []
        ]
        for call in calls:  # strict tools: the stream helper parses the arguments too
            assert call.function.parsed_arguments == json.loads(call.function.arguments)


async def test_parallel_calls_and_auto(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=200, tools=TOOLS, tool_choice="required",
        messages=ask("Weather in Paris and in Rome?"),
    )  # fmt: skip
    calls = list(reply.choices[0].message.tool_calls or [])
    if reply.choices[0].finish_reason == "tool_calls":
        check_calls(calls, {"get_weather", "add"})
    auto = await client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=120, tools=TOOLS, messages=ask("Hello!")
    )
    choice = auto.choices[0]
    # the model answers or calls; either way the reply is one of the two shapes
    if choice.message.tool_calls:
        check_calls(list(choice.message.tool_calls), {"get_weather", "add"})
    else:
        assert choice.message.content is not None and "{" not in choice.message.content[:1]


async def test_bad_schemas_are_400s_naming_the_field(client: openai.AsyncOpenAI) -> None:
    bad_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "nope"}},
    }
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL, messages=ask("x"), response_format=bad_format
        )
    assert refused.value.param == "response_format.json_schema.schema"
    bad_tool: Any = [{"type": "function", "function": {"name": "f", "strict": True,
                      "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}}}}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=ask("x"), tools=bad_tool)
    assert refused.value.param == "tools[0].function.parameters"


async def test_metrics_count_constrained_requests(
    client: openai.AsyncOpenAI, server: LiveServer
) -> None:
    await reply_text(client, False, messages=ask("yes?"), extra_body={"guided_choice": ["yes"]})
    samples = await metrics(server.health)
    assert samples["tl_engine_constrained_requests_total"] >= 1
    assert samples["tl_engine_grammar_compile_seconds_count"] >= 1
    assert samples["tl_engine_grammar_compile_seconds_sum"] > 0
    assert samples["tl_engine_grammar_mask_seconds_count"] >= 1

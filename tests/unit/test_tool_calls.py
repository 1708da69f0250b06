"""Tool calls in generated text: the formats templates speak, and the streaming parser (any
chunking gives the same content and calls; deltas assemble as the openai client does)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frontend.text.tool_calls import (
    HERMES,
    JSON_FORM,
    LLAMA3_JSON,
    CallDelta,
    ToolCallParser,
    ToolSyntax,
    tool_syntax_of,
)
from tests.conftest import llama_cpp_template
from tests.fixtures.chat_templates import SMOLLM_TEMPLATE

W_ARGS = '{"city": "Paris", "days": [1, 2]}'
A_ARGS = '{"a": 1, "b": {"c": "}\\"{"}}'
W = f'{{"name": "get_weather", "arguments": {W_ARGS}}}'
A = f'{{"name": "add", "arguments": {A_ARGS}}}'
CASES: list[tuple[ToolSyntax, bool, str, str, list[tuple[str, str]]]] = [
    # syntax, content is JSON, text, content, [(name, arguments)]
    (HERMES, False, "Just text.", "Just text.", []),
    (HERMES, False, f"<tool_call>\n{W}\n</tool_call>", "", [("get_weather", W_ARGS)]),
    (HERMES, False, f"Sure.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{A}\n</tool_call>",
     "Sure.\n", [("get_weather", W_ARGS), ("add", A_ARGS)]),
    (HERMES, False, "a < b and <tool_ is not a tag", "a < b and <tool_ is not a tag", []),
    (HERMES, False, "ends with <tool_c", "ends with <tool_c", []),
    (HERMES, False, f"  <tool_call>\n{W}\n</tool_call>\n", "", [("get_weather", W_ARGS)]),
    (HERMES, False, '{"answer": 42}', '{"answer": 42}', []),
    (LLAMA3_JSON, False, '{"name": "f", "parameters": {"x": [1, {"y": null}]}}', "",
     [("f", '{"x": [1, {"y": null}]}')]),
    (LLAMA3_JSON, False, "Hello {there}", "Hello {there}", []),
    (JSON_FORM, False, '{"content": "Hi \\"you\\" \\u00e9\\ud83d\\ude00\\n"}', 'Hi "you" é😀\n', []),
    (JSON_FORM, False, f'{{"tool_calls": [{W}, {A}]}}', "",
     [("get_weather", W_ARGS), ("add", A_ARGS)]),
    (JSON_FORM, True, '{"content": {"answer": [1, "]"]}}', '{"answer": [1, "]"]}', []),
    (JSON_FORM, True, '{"content": 12.5}', "12.5", []),
    (JSON_FORM, True, '{"content": "text"}', '"text"', []),
]  # fmt: skip


def assemble(deltas: list[CallDelta]) -> list[dict[str, Any]]:
    """What the openai client builds from tool_call deltas: strings concatenated by index."""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
        call["id"] += d.id or ""
        call["name"] += d.name or ""
        call["arguments"] += d.arguments
    return [calls[i] for i in sorted(calls)]


def run(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[CallDelta]]:
    content, deltas = "", []
    for piece in pieces:
        out = parser.push(piece)
        content += out.content
        deltas += out.calls
    end = parser.finish()
    return content + end.content, deltas + end.calls


@pytest.mark.parametrize(("syntax", "is_json", "text", "content", "calls"), CASES)
def test_whole_text(
    syntax: ToolSyntax, is_json: bool, text: str, content: str, calls: list[tuple[str, str]]
) -> None:
    parser = ToolCallParser(syntax, is_json)
    got_content, deltas = run(parser, [text])
    assert got_content == parser.content == content
    assert [(c.name, c.arguments) for c in parser.calls] == calls
    assert [(c["name"], c["arguments"]) for c in assemble(deltas)] == calls
    assert [c["id"] for c in assemble(deltas)] == [c.id for c in parser.calls]
    for _, arguments in calls:
        json.loads(arguments)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_any_chunking_gives_the_same_content_and_calls(
    case: tuple[ToolSyntax, bool, str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    syntax, is_json, text, content, calls = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    got_content, deltas = run(ToolCallParser(syntax, is_json), pieces)
    assert got_content == content
    assert [(c["name"], c["arguments"]) for c in assemble(deltas)] == calls
    # the name comes once, on the first delta of its call, never after an argument fragment
    seen: set[int] = set()
    for d in deltas:
        assert (d.name is not None) == (d.index not in seen)
        seen.add(d.index)


def test_content_never_shows_the_start_of_a_tag() -> None:
    parser = ToolCallParser(HERMES)
    shown = ""
    for c in f"Let me check. <tool_call>\n{W}\n</tool_call>":
        shown += parser.push(c).content
        assert "<" not in shown
    assert shown == "Let me check. "


def test_a_cut_off_call_keeps_what_was_written() -> None:
    parser = ToolCallParser(JSON_FORM)
    _, deltas = run(parser, ['{"tool_calls": [{"name": "f", "arguments": {"x": "ab'])
    assert [(c.name, c.arguments) for c in parser.calls] == [("f", '{"x": "ab')]
    assert assemble(deltas)[0]["arguments"] == '{"x": "ab'


def test_text_that_leaves_the_format_is_kept_as_content() -> None:
    parser = ToolCallParser(JSON_FORM)
    content, _ = run(parser, ['{"something": 1}'])
    assert content == '{"s' + 'omething": 1}' and not parser.calls


@pytest.mark.parametrize(
    ("name", "syntax"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", HERMES),
        ("Qwen-Qwen3-0.6B", HERMES),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", HERMES),
        ("meta-llama-Llama-3.1-8B-Instruct", LLAMA3_JSON),
        ("meta-llama-Llama-3.2-3B-Instruct", LLAMA3_JSON),
        ("HuggingFaceTB-SmolLM3-3B", JSON_FORM),  # llama.cpp's copy renders no tools
        ("mistralai-Mistral-Nemo-Instruct-2407", JSON_FORM),  # [TOOL_CALLS]: not a format we read
    ],
)
def test_templates_are_recognised_by_their_tool_call_format(name: str, syntax: ToolSyntax) -> None:
    assert tool_syntax_of(llama_cpp_template(name)) is syntax


def test_a_template_without_tools_gets_the_json_form() -> None:
    assert tool_syntax_of(SMOLLM_TEMPLATE) is JSON_FORM

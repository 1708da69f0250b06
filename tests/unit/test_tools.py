"""Tool calling in the frontend: validation, the grammar of each tool choice in each format (it
accepts exactly the replies allowed), the prompt, the history, and the parser reading replies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontend.openai.structured import GrammarChecker, output_constraint
from frontend.openai.tools import (
    plan_tools,
    template_history,
    validate_tools,
    with_system_prompt,
)
from frontend.text.chat_template import ChatTemplate
from frontend.text.tool_calls import (
    HERMES,
    JSON_FORM,
    LLAMA3_JSON,
    ToolCallParser,
    ToolSyntax,
    tool_syntax_of,
)
from shared.errors import ServingError
from tests.conftest import llama_cpp_template
from tests.fixtures.grammars import Vocabulary
from tests.unit.conftest import chat

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}  # fmt: skip
TOOLS = [WEATHER, ADD]
W_ARGS, A_ARGS = '{"city": "Paris"}', '{"a": 1}'


def call(syntax: ToolSyntax, name: str, args: str) -> str:
    return syntax.call_open + name + syntax.call_args + args + syntax.call_close


def calls(syntax: ToolSyntax, *pairs: tuple[str, str]) -> str:
    body = syntax.call_separator.join(call(syntax, n, a) for n, a in pairs)
    return syntax.calls_open + body + syntax.calls_close


def accepts(vocab: Vocabulary, grammar: str, text: str) -> bool:
    matcher = vocab.compiler().compile(grammar)
    ids = vocab.tokenizer.encode(text)
    if matcher.valid_prefix(ids) != len(ids):
        return False
    matcher.accept(ids)
    return matcher.is_complete or matcher.valid_prefix([vocab.eos_ids[0]]) == 1


W, A = ("get_weather", W_ARGS), ("add", A_ARGS)
REPLIES = {
    # (syntax, tool_choice, parallel) -> (accepted, refused)
    (HERMES, "auto", True): (["Hi", "", calls(HERMES, W), "Sure. " + calls(HERMES, W, A) + "\nDone."],
                             [call(HERMES, "nope", "{}"), call(HERMES, "add", '{"a": "x"}')]),
    (HERMES, "auto", False): (["Hi", calls(HERMES, W)], [calls(HERMES, W, A), calls(HERMES, W) + "more"]),
    (HERMES, "required", True): ([calls(HERMES, W), calls(HERMES, A, W)], ["Hi", ""]),
    (HERMES, "named", True): ([calls(HERMES, A), calls(HERMES, A, A)], [calls(HERMES, W)]),
    (LLAMA3_JSON, "auto", True): (["Hi", "", call(LLAMA3_JSON, *W)], ['{"x": 1}', call(LLAMA3_JSON, *W) * 2]),
    (LLAMA3_JSON, "required", True): ([call(LLAMA3_JSON, *A)], ["Hi"]),
    (JSON_FORM, "auto", True): (['{"content": "Hi \\"x\\""}', calls(JSON_FORM, W, A)],
                                ["Hi", '{"tool_calls": []}', '{"content": 1}']),
    (JSON_FORM, "auto", False): ([calls(JSON_FORM, W)], [calls(JSON_FORM, W, A)]),
    (JSON_FORM, "required", True): ([calls(JSON_FORM, A)], ['{"content": "Hi"}']),
    (JSON_FORM, "named", False): ([calls(JSON_FORM, A)], [calls(JSON_FORM, W), calls(JSON_FORM, A, A)]),
}  # fmt: skip


@pytest.mark.parametrize(
    ("syntax", "choice", "parallel"), list(REPLIES), ids=lambda v: getattr(v, "name", str(v))
)
def test_each_tool_choice_allows_exactly_its_replies(
    vocab: Vocabulary, checker: GrammarChecker, syntax: ToolSyntax, choice: str, parallel: bool
) -> None:
    tool_choice: Any = (
        {"type": "function", "function": {"name": "add"}} if choice == "named" else choice
    )
    req = chat(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel)
    plan = plan_tools(req, syntax, None, checker)
    assert plan is not None
    accepted, refused = REPLIES[syntax, choice, parallel]
    for text in accepted:
        assert accepts(vocab, plan.grammar, text), text
        parser = ToolCallParser(syntax)
        parser.push(text)
        parser.finish()
        for c in parser.calls:
            json.loads(c.arguments)
    for text in refused:
        assert not accepts(vocab, plan.grammar, text), text


def test_tools_and_a_response_format_the_answer_is_the_document(
    vocab: Vocabulary, checker: GrammarChecker
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fields = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": True},
        }
    }
    req = chat(tools=TOOLS, **fields)
    constraint = output_constraint(req, checker)
    for syntax, answer in ((HERMES, '{"n": 1}'), (JSON_FORM, '{"content": {"n": 1}}')):
        plan = plan_tools(req, syntax, constraint, checker)
        assert plan is not None and plan.content_is_json
        assert accepts(vocab, plan.grammar, answer)
        assert accepts(vocab, plan.grammar, calls(syntax, W))
        assert not accepts(vocab, plan.grammar, answer.replace("1", '"x"'))
        parser = ToolCallParser(syntax, plan.content_is_json)
        parser.push(answer)
        parser.finish()
        assert json.loads(parser.content) == {"n": 1}
    with pytest.raises(ServingError) as refused:
        plan_tools(req, LLAMA3_JSON, constraint, checker)  # a bare JSON answer would be ambiguous
    assert refused.value.http_status == 422
    with pytest.raises(ServingError):
        plan_tools(chat(tools=TOOLS, tool_choice="required", **fields), HERMES, constraint, checker)
    regex = output_constraint(chat(guided_regex="a+"), checker)
    with pytest.raises(ServingError) as refused:  # only a JSON answer goes beside calls
        plan_tools(chat(tools=TOOLS, guided_regex="a+"), HERMES, regex, checker)
    assert (refused.value.http_status, refused.value.param) == (422, "guided_regex")


def test_no_tools_or_none_make_no_plan(checker: GrammarChecker) -> None:
    assert plan_tools(chat(), HERMES, None, checker) is None
    assert plan_tools(chat(tools=TOOLS, tool_choice="none"), HERMES, None, checker) is None


def test_the_prompt_of_each_format(checker: GrammarChecker) -> None:
    hermes = plan_tools(chat(tools=TOOLS), HERMES, None, checker)
    assert hermes is not None and hermes.system_prompt is None
    assert hermes.template_tools == [
        WEATHER | {"function": {k: v for k, v in WEATHER["function"].items() if k != "strict"}},  # type: ignore[operator]
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "",
                "parameters": ADD["function"]["parameters"],
            },
        },  # type: ignore[index]
    ]
    form = plan_tools(chat(tools=TOOLS, tool_choice="required"), JSON_FORM, None, checker)
    assert form is not None and form.template_tools is None and form.system_prompt is not None
    assert '"name": "get_weather"' in form.system_prompt and '"content"' not in form.system_prompt
    messages = with_system_prompt([{"role": "user", "content": "x"}], "TOOLS")
    assert messages == [{"role": "system", "content": "TOOLS"}, {"role": "user", "content": "x"}]
    messages = with_system_prompt([{"role": "system", "content": "Be brief."}], "TOOLS")
    assert messages == [{"role": "system", "content": "Be brief.\n\nTOOLS"}]


HISTORY = [
    {"role": "user", "content": "Weather in Paris and 1 + 1?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": W_ARGS}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "2"},
]  # fmt: skip


def test_the_history_as_each_kind_of_template_sees_it() -> None:
    req = chat(messages=HISTORY)
    shown: list[dict[str, object]] = [
        {"role": m["role"], "content": m["content"] or ""} for m in HISTORY
    ]
    rendered = template_history(req.messages, shown, HERMES)
    assert rendered[1]["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        },
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "not json"}},
    ]
    assert rendered[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert "tool_calls" not in rendered[0]  # Llama's template tests for the key itself
    form = template_history(req.messages, shown, JSON_FORM)
    assert [m["role"] for m in form] == ["user", "assistant", "user"]
    assert json.loads(str(form[1]["content"])) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": "not json"}]}  # fmt: skip
    assert json.loads(str(form[2]["content"])) == {"tool_results": [
        {"name": "get_weather", "content": "sunny"}, {"name": "add", "content": "2"}]}  # fmt: skip


BAD = [
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "tool", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[b[1] for b in BAD])
def test_bad_tools_are_400s_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ServingError) as refused:
        validate_tools(chat(**fields))
    assert (refused.value.http_status, refused.value.param) == (400, param)


def test_a_strict_tool_whose_schema_does_not_compile_is_a_400(checker: GrammarChecker) -> None:
    broken = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}}}  # fmt: skip
    with pytest.raises(ServingError) as refused:
        plan_tools(chat(tools=[ADD, broken]), JSON_FORM, None, checker)
    assert (refused.value.http_status, refused.value.param) == (400, "tools[1].function.parameters")
    lenient = {"type": "function", "function": broken["function"] | {"strict": False}}  # type: ignore[operator]
    assert plan_tools(chat(tools=[ADD, lenient]), JSON_FORM, None, checker) is not None


@pytest.mark.parametrize(
    ("name", "syntax"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", HERMES),
        ("Qwen-Qwen3-0.6B", HERMES),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", HERMES),
        ("meta-llama-Llama-3.1-8B-Instruct", LLAMA3_JSON),
    ],
)
def test_a_template_renders_past_calls_as_its_grammar_writes_them(
    checker: GrammarChecker, name: str, syntax: ToolSyntax
) -> None:
    """What the template shows of the history's calls is what the reply grammar forces."""
    template = ChatTemplate(llama_cpp_template(name), "<s>", "</s>")
    assert tool_syntax_of(template.tools_source) is syntax
    history = [*HISTORY[:1], {"role": "assistant", "content": None, "tool_calls": HISTORY[1]["tool_calls"][:1]},
               HISTORY[2]]  # fmt: skip
    req = chat(messages=history, tools=TOOLS)
    plan = plan_tools(req, syntax, None, checker)
    assert plan is not None and plan.template_tools is not None
    shown: list[dict[str, object]] = [
        {"role": m["role"], "content": m["content"] or ""} for m in history
    ]
    text = template.render(
        template_history(req.messages, shown, syntax),
        add_generation_prompt=True,
        tools=plan.template_tools,
    )
    assert call(syntax, "get_weather", W_ARGS) in text
    assert "The weather in a city" in text and "sunny" in text


def test_a_models_tool_use_template_decides_the_tool_call_format() -> None:
    """Hermes 2 Pro ships a plain template and a tool_use one: requests with tools render
    through the latter, so its `<tool_call>` format is the one the reply is held to."""
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tool_use = llama_cpp_template("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use")
    template = ChatTemplate(plain, "<s>", "</s>", tool_use_source=tool_use)
    assert tool_syntax_of(template.tools_source) is HERMES
    assert tool_syntax_of(ChatTemplate(plain, "<s>", "</s>").tools_source) is JSON_FORM

"""Real chat templates (llama.cpp's models/templates, `make testdata`) rendered by ChatTemplate
byte for byte as transformers' apply_chat_template renders them (jinja2 with its settings),
on conversations with and without a system prompt, several turns, tools, tool calls and tool
results, with and without the generation prompt. Where the reference refuses a conversation
(the template's raise_exception), ChatTemplate refuses it with the same message.

FAMILIES are the templates of the model families served; every other template in the folder
is checked the same way, except the few listed with the reason they differ.
"""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from frontend.text import chat_template as chat_template_module
from frontend.text.chat_template import ChatTemplate, TemplateError, TemplateRenderError
from tests.conftest import require_llama_cpp_data
from tests.fixtures.hf_chat_template import NOW, FixedClock, hf_render
from tests.fixtures.llama_cpp_data import TEMPLATES

FAMILIES = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-QwQ-32B.jinja",
    "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "google-gemma-2-2b-it.jinja",
    "google-gemma-4-31B-it.jinja",
    "google-gemma-4-31B-it-interleaved.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "unsloth-mistral-Devstral-Small-2507.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
]
# templates refused at load here, and a conversation transformers fails on too: from_json is no
# jinja2 filter (a template using a filter that does not exist is refused, even in a branch
# that only some conversations take); firefunction needs a `functions` variable
REFUSED = {
    "deepseek-ai-DeepSeek-V3.2.jinja": "tool call, JSON arguments",
    "deepseek-ai-DeepSeek-V4.jinja": "tool call, JSON arguments",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "tool call, JSON arguments",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "user",
}
# where minijinja and jinja2 part ways (none of them a family's template)
DIFFERENT = {
    "meetkai-functionary-medium-v3.1.jinja": "jinja2 escapes a str added to a |safe string",
    "llama-cpp-deepseek-r1.jinja": "jinja2's tojson fails on map()'s generator; here it is a list",
    "LFM2.5-8B-A1B.jinja": "a loop over none content: jinja2 fails, minijinja loops zero times",
}

SYSTEM = {"role": "system", "content": "You are terse. Answer in «one» line."}
USER = {"role": "user", "content": "What is 2+2?"}
ASSISTANT = {"role": "assistant", "content": "4."}
USER2 = {"role": "user", "content": "And the weather in Paris?\n"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]


def call(arguments: object, content: str | None) -> dict[str, Any]:
    function = {"name": "get_weather", "arguments": arguments}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
    }


RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"c": 18}'}
ANSWER = {"role": "assistant", "content": "18 °C in Paris."}
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "user": ([USER], None),
    "system": ([SYSTEM, USER], None),
    "multi-turn": ([SYSTEM, USER, ASSISTANT, USER2], None),
    "multi-turn without system": ([USER, ASSISTANT, USER2], None),
    "tools": ([USER2], TOOLS),
    "tools and system": ([SYSTEM, USER2], TOOLS),
    "tool call, dict arguments": ([SYSTEM, USER2, call({"city": "Paris"}, None), RESULT], TOOLS),
    "tool call, JSON arguments": ([USER2, call('{"city": "Paris"}', ""), RESULT, ANSWER], TOOLS),
}
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def template_names() -> list[str]:
    if not TEMPLATES.is_dir():
        return FAMILIES
    return sorted(p.name for p in TEMPLATES.glob("*.jinja"))


def source(name: str) -> str:
    require_llama_cpp_data()
    return (TEMPLATES / name).read_text(encoding="utf-8")


def cases(name: str, text: str) -> list[tuple[str, bool, dict[str, Any]]]:
    """(conversation, add_generation_prompt, variables) to render this template with."""
    names = list(CONVERSATIONS)
    if "tool_use" in name:  # rendered only when a request has tools (transformers picks it so)
        names = [n for n in names if CONVERSATIONS[n][1] is not None]
    out = [(n, g, {}) for n in names for g in (True, False)]
    if "enable_thinking" in text:
        out += [(n, True, {"enable_thinking": False}) for n in names[:2]]
    return out


def mismatches(name: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every case where ChatTemplate does not do what the reference does, described."""
    monkeypatch.setattr(chat_template_module, "datetime", FixedClock)
    text = source(name)
    template = ChatTemplate(text, **SPECIAL_TOKENS)
    wrong = []
    for conversation, add_generation_prompt, variables in cases(name, text):
        messages, tools = CONVERSATIONS[conversation]
        label = f"{conversation}, generation prompt {add_generation_prompt}, {variables}"
        context = SPECIAL_TOKENS | variables | {"strftime_now": NOW.strftime}
        try:
            expected: str | Exception = hf_render(
                text, messages, add_generation_prompt, tools, **context
            )
        except (jinja2.TemplateError, TypeError, ValueError) as e:
            expected = e
        try:
            got: str | TemplateRenderError = template.render(
                messages, add_generation_prompt, tools=tools, variables=variables
            )
        except TemplateRenderError as e:
            got = e
        if isinstance(expected, str):
            if got != expected:
                wrong.append(f"{label}: {got!r} != {expected!r}")
        elif not isinstance(got, TemplateRenderError):
            wrong.append(f"{label}: rendered, the reference fails with {expected!r}")
        elif type(expected) is jinja2.TemplateError and got.message != str(expected):
            wrong.append(
                f"{label}: refused with {got.message!r}, not {expected}"
            )  # raise_exception
    return wrong


def test_family_templates_are_in_the_folder() -> None:
    require_llama_cpp_data()
    present = set(template_names())
    assert set(FAMILIES) <= present
    assert set(REFUSED) | set(DIFFERENT) <= present


@pytest.mark.parametrize("name", FAMILIES)
def test_family_template_renders_as_transformers_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert mismatches(name, monkeypatch) == []


OTHERS = [n for n in template_names() if n not in FAMILIES and n not in REFUSED]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=DIFFERENT[n], strict=True))
        if n in DIFFERENT
        else n
        for n in OTHERS
    ],
)
def test_other_template_renders_as_transformers_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert mismatches(name, monkeypatch) == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_templates_transformers_fails_on_are_refused(name: str) -> None:
    text = source(name)
    with pytest.raises(TemplateError):
        ChatTemplate(text, **SPECIAL_TOKENS)
    messages, tools = CONVERSATIONS[REFUSED[name]]
    with pytest.raises(jinja2.TemplateError):
        hf_render(text, messages, True, tools, **SPECIAL_TOKENS)


def test_generation_tags_render_their_body() -> None:
    text = "{% for m in messages %}{%- generation -%}\n  [{{ m.content }}]\n{%- endgeneration %}{% endfor %}"
    expected = hf_render(text, [USER, ASSISTANT], False)
    assert expected == "[What is 2+2?][4.]"
    assert ChatTemplate(text, "", "").render([USER, ASSISTANT], False) == expected


def test_a_tool_use_template_is_used_when_tools_are_given() -> None:
    template = ChatTemplate("plain", "", "", tool_use_source="{{ tools|length }} tools")
    assert template.render([USER], True) == "plain"
    assert template.render([USER], True, tools=TOOLS) == "2 tools"
    assert template.render([USER], True, tools=[]) == "0 tools"
    assert ChatTemplate("plain", "", "").render([USER], True, tools=TOOLS) == "plain"


def test_iterable_and_sequence_tests_as_jinja2_has_them() -> None:
    text = (
        "{% for v in [none, 'ab', [1], {'a': 1}, 3] %}"
        "{{ v is iterable }}/{{ v is sequence }} {% endfor %}"
    )
    expected = hf_render(text, [], False)
    assert expected == "False/False True/True True/True True/True False/False "
    assert ChatTemplate(text, "", "").render([], False) == expected


def test_variables_reach_the_template() -> None:
    text = "{{ enable_thinking }}|{{ documents }}|{{ add_generation_prompt }}"
    template = ChatTemplate(text, "", "")
    assert template.render([], True, variables={"enable_thinking": False}) == "False|None|True"
    # the arguments of render win over variables of the same name
    assert template.render([], False, variables={"add_generation_prompt": True}) == ("|None|False")

"""Tool calling: a request's `tools` and `tool_choice` as a prompt, a grammar and a parser.

For a chat template that speaks a tool-call format (frontend/text/tool_calls.py), the template
renders `tools` and the history's calls itself; otherwise the tools are described in the system
prompt and the reply takes the JSON form. Either way the reply is constrained by one grammar
built from the format's literals: `auto` leaves the model free to answer or to call, `required`
and a named choice force calls, and each call's arguments follow its tool's schema (strictly
when the tool says `strict`). With `tool_choice: "none"` the tools are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from frontend.openai.requests import (
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    Tool,
    ToolCall,
)
from frontend.openai.structured import Constraint, GrammarChecker
from frontend.openai.validation import invalid, unsupported
from frontend.text.tool_calls import ToolSyntax
from shared.grammar import json_options, json_schema_grammar, lark_grammar, lark_literal

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
Message = dict[str, object]  # one message as the chat template sees it


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one request calls tools: the grammar of its reply and how to read the reply back."""

    syntax: ToolSyntax
    grammar: str
    content_is_json: bool  # JSON form: the answer is a document of the response_format
    template_tools: list[dict[str, object]] | None  # for a template that renders `tools`
    system_prompt: str | None  # the tools described, for a template that does not


def plan_tools(
    req: ChatCompletionRequest,
    syntax: ToolSyntax,
    constraint: Constraint | None,
    checker: GrammarChecker,
) -> ToolPlan | None:
    """The tool plan of a validated request; None if it calls no tools (none given, or "none")."""
    tools = req.tools or []
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    if not tools or choice == "none":
        return None
    if constraint is not None and (
        choice != "auto" or syntax.free_text == "first" or constraint.schema is None
    ):
        raise unsupported(
            constraint.param,
            "With tools, only a JSON output constraint is served, under tool_choice 'auto' "
            "and a template whose answers are not bare JSON.",
        )
    for i, tool in enumerate(tools):  # each schema alone first: a refusal names its tool
        schema, lenient = _arguments(tool)
        checker.check(
            f"tools[{i}].function.parameters", partial(json_schema_grammar, schema, lenient)
        )
    called = [
        t for t in tools if isinstance(choice, str) or t.function.name == choice.function.name
    ]
    parallel = syntax.parallel and req.parallel_tool_calls is not False
    lark = _grammar(syntax, called, choice == "auto", parallel, constraint)
    grammar = checker.check("tools", lambda: lark_grammar(lark))
    descriptions = [_description(t) for t in tools]
    if syntax.in_template:
        return ToolPlan(syntax, grammar, constraint is not None, descriptions, None)
    prompt = _system_prompt(descriptions, choice, parallel)
    return ToolPlan(syntax, grammar, constraint is not None, None, prompt)


def validate_tools(req: ChatCompletionRequest) -> None:
    """`tools`, `tool_choice` and the history's calls: 400s naming the field."""
    if req.tools is not None and not req.tools:
        raise invalid("tools", "'tools' must not be empty (leave it out for no tools).")
    names = _tool_names(req.tools or [])
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise invalid(
            "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a function."
        )
    if choice is not None and choice != "none" and not names:
        raise invalid("tool_choice", "'tool_choice' is only allowed when 'tools' are given.")
    if isinstance(choice, NamedToolChoice) and (
        choice.type != "function" or choice.function.name not in names
    ):
        raise invalid(
            "tool_choice",
            f"'tool_choice' names the function '{choice.function.name}', not one of the tools.",
        )
    for i, message in enumerate(req.messages):
        if message.tool_calls is not None and message.role != "assistant":
            raise invalid(f"messages[{i}].tool_calls", "Only assistant messages make tool calls.")
        for j, call in enumerate(message.tool_calls or []):
            if call.type != "function":
                raise invalid(
                    f"messages[{i}].tool_calls[{j}].type", "Tool calls are of type 'function'."
                )


def _tool_names(tools: Sequence[Tool]) -> set[str]:
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.type != "function":
            raise invalid(f"tools[{i}].type", "Only tools of type 'function' are supported.")
        name = tool.function.name
        if TOOL_NAME.fullmatch(name) is None:
            raise invalid(
                f"tools[{i}].function.name",
                "A function name is 1 to 64 letters, digits, underscores or dashes.",
            )
        if name in names:
            raise invalid(f"tools[{i}].function.name", f"Two tools are named '{name}'.")
        names.add(name)
        params = tool.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise invalid(
                f"tools[{i}].function.parameters", "The parameters must be an object schema."
            )
    return names


# ---- the grammar ----------------------------------------------------------------------------


def _arguments(tool: Tool) -> tuple[dict[str, Any], bool]:
    """A tool's arguments schema (an object, `{}` if none given) and whether it is lenient."""
    schema = dict(tool.function.parameters or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    return schema, not tool.function.strict


def _call_rule(syntax: ToolSyntax, tool: Tool, head: str) -> str:
    schema, lenient = _arguments(tool)
    schema["x-guidance"] = json_options(lenient)
    opening = syntax.call_open[len(syntax.trigger) :] if head else syntax.call_open
    name = lark_literal(opening + tool.function.name + syntax.call_args)
    return f"{head} {name} %json {json.dumps(schema)} {lark_literal(syntax.call_close)}"


def _grammar(
    syntax: ToolSyntax,
    tools: Sequence[Tool],
    auto: bool,
    parallel: bool,
    constraint: Constraint | None,
) -> str:
    """The Lark grammar (llguidance's dialect) of every reply the request allows."""
    free = auto and constraint is None and syntax.free_text == "tag"
    # in free text, a call begins where the text first writes the trigger (a lazy lexeme)
    head = "head" if free else ""
    rules = [f"call: {' | '.join(f'call_{i}' for i in range(len(tools)))}"]
    rules += [f"call_{i}: {_call_rule(syntax, t, head)}" for i, t in enumerate(tools)]
    many = f" ({lark_literal(syntax.call_separator)} call)*" if parallel else ""
    if syntax.free_text == "tag":
        if free:
            start = "call* text" if parallel else "text | call"
            rules += [
                "text: TEXT",
                "TEXT: /(.|\\n)*/",
                f"head[lazy]: TEXT {lark_literal(syntax.trigger)}",
            ]
        else:
            start = "calls" if constraint is None else "doc | calls"
        rules.append(f"calls: call{many}")
    elif syntax.free_text == "first":
        start = "TEXT | call" if auto else "call"
        rules.append("TEXT: /([^{](.|\\n)*)?/")  # a text answer never opens with a brace
    else:
        calls = f"{lark_literal(syntax.calls_open)} call{many} {lark_literal(syntax.calls_close)}"
        answer = f"{lark_literal(syntax.content_open)} doc {lark_literal(syntax.content_close)}"
        start = f"{answer} | {calls}" if auto else calls
    if "doc" in start:
        schema: dict[str, Any] = (
            {"type": "string"} if constraint is None or constraint.schema is None
            else dict(constraint.schema)
        )  # fmt: skip
        schema["x-guidance"] = json_options(constraint is not None and not constraint.strict)
        rules.append(f"doc: %json {json.dumps(schema)}")
    return "\n".join(["%llguidance {}", f"start: {start}", *rules]) + "\n"


# ---- the prompt -----------------------------------------------------------------------------


def _description(tool: Tool) -> dict[str, object]:
    """A tool as OpenAI documents describe it (templates such as Hermes' need a description)."""
    function: dict[str, object] = {
        "name": tool.function.name,
        "description": tool.function.description or "",
        "parameters": _arguments(tool)[0],
    }
    return {"type": "function", "function": function}


def _system_prompt(
    descriptions: Sequence[Mapping[str, object]], choice: str | NamedToolChoice, parallel: bool
) -> str:
    call = '{"name": "<function name>", "arguments": <its arguments as a JSON object>}'
    calls = f'{{"tool_calls": [{call}{", ..." if parallel else ""}]}}'
    lines = [
        "You can call functions. Each one is described by a JSON object: its name, what it "
        "does, and the JSON schema of its arguments.",
        *(json.dumps(d["function"]) for d in descriptions),
        "",
    ]
    if choice == "auto":
        lines.append(
            'Reply with one JSON object: to answer, {"content": "<your answer>"}; to call '
            f"functions, {calls}."
        )
    elif choice == "required":
        lines.append(f"Reply with one JSON object that calls functions: {calls}.")
    else:
        assert isinstance(choice, NamedToolChoice)
        lines.append(
            f"Reply with one JSON object that calls the function {choice.function.name}: {calls}."
        )
    return "\n".join(lines)


def with_system_prompt(messages: list[Message], prompt: str) -> list[Message]:
    """The conversation with `prompt` added to its system message (one is made if none)."""
    if messages and messages[0].get("role") in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{prompt}".lstrip("\n")
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def template_history(
    messages: Sequence[ChatMessage], shown: Sequence[Message], syntax: ToolSyntax
) -> list[Message]:
    """The conversation as the chat template gets it (`shown`: role and content of each
    message), with the history's tool calls and results in the form the template knows."""
    if syntax.in_template:
        return [_with_tool_fields(m, s) for m, s in zip(messages, shown, strict=True)]
    names = {c.id: c.function.name for m in messages for c in m.tool_calls or () if c.id}
    out: list[Message] = []
    results: list[dict[str, object]] = []  # consecutive tool results: one user message
    for message, base in zip(messages, shown, strict=True):
        if message.role == "tool":
            name = names.get(message.tool_call_id or "", "")
            results.append({"name": name, "content": base["content"]})
            continue
        if results:
            out.append({"role": "user", "content": json.dumps({"tool_results": results})})
            results = []
        if message.tool_calls:
            calls = [{"name": c.function.name, "arguments": _parsed(c)} for c in message.tool_calls]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
        else:
            out.append(dict(base))
    if results:
        out.append({"role": "user", "content": json.dumps({"tool_results": results})})
    return out


def _with_tool_fields(message: ChatMessage, base: Message) -> Message:
    """A message as transformers passes it: `tool_calls` only where calls were made."""
    out = dict(base)
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _parsed(c)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _parsed(call: ToolCall) -> object:
    """A call's arguments as a template's tojson should see them: parsed when they are JSON."""
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments

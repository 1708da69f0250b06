"""Tool calls in generated text: how a chat format writes them, and a streaming parser.

A chat template that speaks a tool-call format is recognised by its source: Hermes-style
`<tool_call>` JSON (Qwen2.5, Qwen3, Hermes, SmolLM3's original) or Llama 3.1's bare JSON
object. Any other template gets the JSON form the server describes in the system prompt itself:
one object, `{"content": ...}` or `{"tool_calls": [...]}`. Every call is written one way:
`{"name": "<name>", "arguments": <object>}` (Llama: "parameters"), because the output is
constrained by a grammar built from the same literals (frontend/openai/tools.py).

`ToolCallParser` turns the text, however it is chunked, into the same content and the same
calls: content is released once it cannot be the start of a call, a call's name once whole,
its arguments as they come (their fragments concatenate to the arguments' JSON text).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class ToolSyntax:
    """The literals one chat format writes around tool calls."""

    name: str
    call_open: str  # up to the function name
    call_args: str  # between the name and the arguments object
    call_close: str
    in_template: bool  # the template renders `tools` itself; else the server describes them
    free_text: str = ""  # "tag": text around calls; "first": text unless it starts a call
    calls_open: str = ""  # JSON form: around the list of calls, and between two of them
    call_separator: str = ""
    calls_close: str = ""
    content_open: str = ""  # JSON form: around the answer when no tool is called
    content_close: str = ""
    parallel: bool = True  # several calls in one answer

    @property
    def trigger(self) -> str:
        """What starts a call in free text."""
        return self.call_open.split("\n", 1)[0] if self.free_text == "tag" else "{"


HERMES = ToolSyntax(
    name="hermes",
    call_open='<tool_call>\n{"name": "',
    call_args='", "arguments": ',
    call_close="}\n</tool_call>",
    in_template=True,
    free_text="tag",
    call_separator="\n",
)
LLAMA3_JSON = ToolSyntax(
    name="llama3_json",
    call_open='{"name": "',
    call_args='", "parameters": ',
    call_close="}",
    in_template=True,
    free_text="first",
    parallel=False,  # the template renders one call per assistant message
)
JSON_FORM = ToolSyntax(
    name="json",
    call_open='{"name": "',
    call_args='", "arguments": ',
    call_close="}",
    in_template=False,
    calls_open='{"tool_calls": [',
    call_separator=", ",
    calls_close="]}",
    content_open='{"content": ',
    content_close="}",
)


def tool_syntax_of(template_source: str) -> ToolSyntax:
    """The tool-call format a chat template speaks, JSON_FORM if it speaks none we know."""
    source = template_source
    if "tools" not in source:
        return JSON_FORM
    # the template writes calls as JSON objects (not XML-style <function=...> or <arg_key>)
    if "<tool_call>" in source and "<tool_calls>" not in source and '"arguments": ' in source:
        return HERMES
    if '"parameters": ' in source and '{"name": function name' in source:
        return LLAMA3_JSON
    return JSON_FORM


@dataclass(frozen=True, slots=True)
class CallDelta:
    """Part of one call: its id and name on the first delta, then argument fragments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


class ParsedCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text


class Parsed(NamedTuple):
    """What one push released."""

    content: str
    calls: list[CallDelta]


class _State(Enum):
    TEXT = 0  # free text (content), watching for a call's trigger
    LITERAL = 1  # a fixed string the format writes
    NAME = 2  # a function name, up to its closing quote
    ARGS = 3  # the arguments object, streamed
    CONTENT_STRING = 4  # JSON form: the answer as a JSON string, decoded
    CONTENT_VALUE = 5  # JSON form: the answer as a JSON document, verbatim
    DONE = 6
    RAW = 7  # the text left the format: the rest is content, as it is


class _JsonEnd:
    """Where one JSON value ends, fed a character at a time (the value has no outer spaces)."""

    __slots__ = ("depth", "escape", "in_string", "scalar")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.scalar = False

    def feed(self, c: str) -> int:
        """1: `c` belongs to the value, 2: `c` ends it, 0: the value ended before `c`."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
                return 2 if self.depth == 0 else 1
            return 1
        if self.scalar and not (c.isalnum() or c in "+-."):
            return 0
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return 2 if self.depth == 0 else 1
        elif self.depth == 0:
            self.scalar = True
        return 1


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass(slots=True)
class _StringDecoder:
    """A JSON string's characters, decoded as they come (escapes held until whole)."""

    escape: str = ""  # the escape read so far, from its backslash
    high: int | None = None  # a high surrogate waiting for its pair

    def feed(self, c: str) -> str | None:
        """The decoded text `c` completes; None when `c` is the closing quote."""
        if not self.escape:
            if c == '"':
                return None
            if c != "\\":
                return c
        self.escape += c
        if len(self.escape) == 2 and self.escape[1] != "u":
            text, self.escape = _ESCAPES.get(self.escape[1], self.escape[1]), ""
            return text
        if len(self.escape) < 6:
            return ""
        code, self.escape = int(self.escape[2:], 16), ""
        if 0xD800 <= code < 0xDC00:
            self.high = code
            return ""
        if 0xDC00 <= code < 0xE000 and self.high is not None:
            code = 0x10000 + ((self.high - 0xD800) << 10) + (code - 0xDC00)
        self.high = None
        return chr(code)


@dataclass(slots=True)
class ToolCallParser:
    """The content and tool calls of one generated text, pushed chunk by chunk."""

    syntax: ToolSyntax
    content_is_json: bool = False  # JSON form: the answer is a JSON document, not a string
    content: str = ""  # everything released as content so far
    _calls: list[tuple[str, str, list[str]]] = field(default_factory=list)  # id, name, arguments
    _state: _State = _State.TEXT
    _options: tuple[tuple[str, _State], ...] = ()  # LITERAL: alternatives and where each leads
    _matched: str = ""  # LITERAL: what matched so far
    _held: str = ""  # TEXT: a possible start of a call's trigger
    _space: str = ""  # TEXT: leading whitespace of a text segment, dropped if nothing follows
    _segment: bool = False  # TEXT: the segment has shown something besides whitespace
    _started: bool = False  # anything at all was read
    _name: str = ""
    _json: _JsonEnd = field(default_factory=_JsonEnd)
    _string: _StringDecoder = field(default_factory=_StringDecoder)
    _out: list[str] = field(default_factory=list)
    _deltas: list[tuple[int, bool, list[str]]] = field(default_factory=list)  # call, opens it, args

    @property
    def calls(self) -> list[ParsedCall]:
        """Every call read so far (the last one may be cut short)."""
        return [ParsedCall(i, name, "".join(args)) for i, name, args in self._calls]

    def __post_init__(self) -> None:
        if not self.syntax.free_text:
            # the answer is a document, or a JSON string (its opening quote is the format's)
            answer = (
                (self.syntax.content_open, _State.CONTENT_VALUE)
                if self.content_is_json
                else (self.syntax.content_open + '"', _State.CONTENT_STRING)
            )
            self._expect(answer, (self.syntax.calls_open + self.syntax.call_open, _State.NAME))

    def push(self, text: str) -> Parsed:
        for c in text:
            self._step(c)
        return self._release()

    def finish(self) -> Parsed:
        """The end of the text: what was held back and could not start a call is content."""
        if self._state is _State.TEXT:
            self._text(self._held)
            self._held = ""
        return self._release()

    # ---- one character ---------------------------------------------------------------------

    def _step(self, c: str) -> None:
        state = self._state
        if state is _State.TEXT:
            self._in_text(c)
        elif state is _State.LITERAL:
            self._in_literal(c)
        elif state is _State.NAME:
            if c == '"':
                self._begin_call()
            else:
                self._name += c
        elif state is _State.ARGS:
            self._in_args(c)
        elif state is _State.CONTENT_STRING:
            decoded = self._string.feed(c)
            if decoded is None:
                self._expect((self.syntax.content_close, _State.DONE))
            else:
                self._out.append(decoded)
        elif state is _State.CONTENT_VALUE:
            self._in_value(c)
        elif state is _State.RAW or not c.isspace():  # after DONE only whitespace is dropped
            self._out.append(c)
        self._started = True

    def _in_text(self, c: str) -> None:
        syntax = self.syntax
        if syntax.free_text == "first":
            if not self._started and c == syntax.trigger:
                self._expect((syntax.call_open[1:], _State.NAME))
                return
            self._text(c)
            return
        self._held += c
        trigger = syntax.trigger
        if self._held == trigger:
            self._held, self._space = "", ""  # whitespace before a call is not content
            self._expect((syntax.call_open[len(trigger) :], _State.NAME))
            return
        keep = next(
            (k for k in range(min(len(self._held), len(trigger) - 1), 0, -1)
             if trigger.startswith(self._held[-k:])),
            0,
        )  # fmt: skip
        self._text(self._held[: len(self._held) - keep])
        self._held = self._held[len(self._held) - keep :]

    def _text(self, text: str) -> None:
        for c in text:
            if not self._segment and c.isspace():
                self._space += c
                continue
            self._segment = True
            self._out.append(self._space + c)
            self._space = ""

    def _in_literal(self, c: str) -> None:
        matched = self._matched + c
        options = [(lit, then) for lit, then in self._options if lit.startswith(matched)]
        if not options:
            # the text left the format (it cannot under the grammar): keep it as content
            self._out.append(matched)
            self._state = _State.RAW
            return
        self._matched, self._options = matched, tuple(options)
        done = next(((lit, then) for lit, then in options if lit == matched), None)
        if done is not None:
            self._enter(done[1])

    def _in_args(self, c: str) -> None:
        verdict = self._json.feed(c)
        if verdict:
            self._arguments(c)
        if verdict != 1:
            self._after_call()
            if verdict == 0:
                self._step(c)

    def _in_value(self, c: str) -> None:
        verdict = self._json.feed(c)
        if verdict:
            self._out.append(c)
        if verdict != 1:
            self._expect((self.syntax.content_close, _State.DONE))
            if verdict == 0:
                self._step(c)

    # ---- transitions ----------------------------------------------------------------------

    def _expect(self, *options: tuple[str, _State]) -> None:
        self._state, self._options, self._matched = _State.LITERAL, options, ""

    def _enter(self, state: _State) -> None:
        self._state = state
        if state is _State.NAME:
            self._name = ""
        elif state in (_State.ARGS, _State.CONTENT_VALUE):
            self._json = _JsonEnd()
        elif state is _State.CONTENT_STRING:
            self._string = _StringDecoder()
        elif state is _State.TEXT:
            self._segment, self._space = False, ""

    def _begin_call(self) -> None:
        self._calls.append((f"call_{uuid.uuid4().hex[:24]}", self._name, []))
        self._deltas.append((len(self._calls) - 1, True, []))
        self._expect((self.syntax.call_args[1:], _State.ARGS))

    def _arguments(self, fragment: str) -> None:
        index = len(self._calls) - 1
        self._calls[index][2].append(fragment)
        if not self._deltas or self._deltas[-1][:2] != (index, False):
            self._deltas.append((index, False, []))
        self._deltas[-1][2].append(fragment)

    def _after_call(self) -> None:
        s = self.syntax
        if s.free_text == "tag":
            self._expect((s.call_close, _State.TEXT))
        elif s.free_text == "first":
            self._expect((s.call_close, _State.DONE))
        else:
            self._expect(
                (s.call_close + s.call_separator + s.call_open, _State.NAME),
                (s.call_close + s.calls_close, _State.DONE),
            )

    def _release(self) -> Parsed:
        text = "".join(self._out)
        self.content += text
        deltas = []
        for index, opens, fragments in self._deltas:
            call_id, name, _ = self._calls[index]
            if opens:  # the first delta of a call: its id and name, no arguments yet
                deltas.append(CallDelta(index, call_id, name, ""))
            else:
                deltas.append(CallDelta(index, None, None, "".join(fragments)))
        self._out, self._deltas = [], []
        return Parsed(text, deltas)

"""A model's chat template, rendered with minijinja the way transformers' apply_chat_template does.

transformers renders with jinja2: trim_blocks, lstrip_blocks, loop controls, its own tojson
(json.dumps, non-ASCII kept), raise_exception, strftime_now, and a `{% generation %}` tag that
only marks the assistant's text. Where minijinja's defaults differ from jinja2's in what
real templates use, this module makes them agree: the `iterable` and `sequence` tests (jinja2:
None is not iterable, a string or a dict is a sequence) and the generation tag.

`render(messages, add_generation_prompt, tools=None, variables=None)` takes the conversation
as transformers does: messages are dicts with "role" and "content", and an assistant message
may carry "tool_calls" ([{"type": "function", "function": {"name", "arguments"}}], arguments
a dict or a JSON string as the template expects), answered by {"role": "tool", "content",
"tool_call_id", "name"} messages; `tools` is the list of OpenAI tool definitions
({"type": "function", "function": {"name", "description", "parameters"}}); `variables` are
further template variables (Qwen 3's enable_thinking, ...). A model whose metadata has a
separate tool_use template (Hermes 2 Pro, Command R) renders with it when tools is not None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

import minijinja

# For models that carry no template: "<|role|>\ncontent\n" per message, then "<|assistant|>\n".
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + (message['content'] or '') + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Instructions one render may execute (~50 million a second): far above what a long
# conversation needs (a few dozen per message), low enough that a runaway loop fails fast.
DEFAULT_FUEL = 5_000_000

_NAME = "chat_template"
_SAMPLE: list[dict[str, object]] = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]
_TOOL_USE = "tool_use"
_SAMPLE_TOOLS: list[dict[str, object]] = [
    {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
]
_TAG_OPEN = re.compile(r"\{\{|\{%|\{#")
# transformers' `{% generation %}...{% endgeneration %}` marks text and renders it as it is:
# an `if true` block with the same whitespace control renders the same
_GENERATION = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")
_RAW = re.compile(r"[-+]?\s*raw\s*[-+]?$")
_END_RAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_FILTER = re.compile(r"\|\s*([A-Za-z_]\w*)|^[-+]?\s*filter\s+([A-Za-z_]\w*)")
_TEST = re.compile(r"\bis\s+(?:not\s+)?([A-Za-z_]\w*)")


class TemplateError(Exception):
    """A chat template that cannot be used: refused when the model loads."""


class TemplateRenderError(Exception):
    """Rendering failed for this request (the template's raise_exception, a bad value): a 400."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: plain json.dumps, non-ASCII kept (minijinja's own escapes HTML)
    try:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )
    except (TypeError, ValueError) as e:
        raise TemplateRenderError(f"tojson: {e}") from e


def _iterable(value: object) -> bool:
    # jinja2's test: what iter() accepts (minijinja also says none is iterable). An undefined
    # value arrives as None: not iterable here, iterable (empty) in jinja2; templates test it
    # before a loop that would do nothing either way
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def _sequence(value: object) -> bool:
    # jinja2's test: what has a length and an item lookup, strings and dicts included
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _without_generation_tags(source: str) -> str:
    return _GENERATION.sub(
        lambda m: "{%" + m[1] + (" endif " if m[2] else " if true ") + m[3] + "%}", source
    )


def _scan_code(source: str, start: int, closer: str) -> tuple[str, int]:
    """The code of one tag from start up to its closer, string literals emptied; and the end."""
    code: list[str] = []
    i = start
    while i < len(source) and not source.startswith(closer, i):
        char = source[i]
        if char in "'\"":
            end = i + 1
            while end < len(source) and source[end] != char:
                end += 2 if source[end] == "\\" else 1
            code.append("''")
            i = end + 1
        else:
            code.append(char)
            i += 1
    return "".join(code), i + len(closer)


def _code_segments(source: str) -> Iterator[str]:
    """The code inside every {{ }} and {% %} tag, skipping comments and raw blocks."""
    i = 0
    while match := _TAG_OPEN.search(source, i):
        opener = match.group()
        if opener == "{#":
            end = source.find("#}", match.end())
            i = len(source) if end < 0 else end + 2
            continue
        code, i = _scan_code(source, match.end(), "}}" if opener == "{{" else "%}")
        if opener == "{%" and _RAW.match(code.strip()):
            end_raw = _END_RAW.search(source, i)
            i = len(source) if end_raw is None else end_raw.end()
            continue
        yield code


def _filter_and_test_names(source: str) -> tuple[set[str], set[str]]:
    filters: set[str] = set()
    tests: set[str] = set()
    for code in _code_segments(source):
        filters.update(a or b for a, b in _FILTER.findall(code.strip()))
        tests.update(_TEST.findall(code))
    return filters, tests


class ChatTemplate:
    """A compiled chat template; checked at construction so a broken one fails at load."""

    def __init__(
        self,
        source: str,
        bos_token: str,
        eos_token: str,
        fuel: int = DEFAULT_FUEL,
        tool_use_source: str | None = None,
    ) -> None:
        self.source = source
        # transformers renders with trim_blocks, lstrip_blocks and no trailing newline
        self._env = minijinja.Environment(
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
            fuel=fuel,
            pycompat=True,  # Python string and dict methods: .strip(), .startswith(), .items()
        )
        # callables added as globals are the template's functions
        self._env.add_global("raise_exception", _raise_exception)
        self._env.add_global("strftime_now", _strftime_now)
        self._env.add_filter("tojson", _tojson)
        self._env.add_test("iterable", _iterable)
        self._env.add_test("sequence", _sequence)
        self._env.add_global("bos_token", bos_token)
        self._env.add_global("eos_token", eos_token)
        self._tool_use = tool_use_source is not None
        for name, text in ((_NAME, source), (_TOOL_USE, tool_use_source)):
            if text is None:
                continue
            text = _without_generation_tags(text)
            try:
                self._env.add_template(name, text)
            except minijinja.TemplateError as e:
                raise TemplateError(f"chat template does not compile: {e.message}") from e
            self._check_names(text)
        self._trial_render(None)
        if self._tool_use:
            self._trial_render(_SAMPLE_TOOLS)

    def _check_names(self, source: str) -> None:
        """Refuse unknown filters and tests, even in branches the trial render does not take."""
        filters, tests = _filter_and_test_names(source)
        probes = [("filter", f, "{{ x|" + f + " }}") for f in sorted(filters)]
        probes += [("test", t, "{{ x is " + t + " }}") for t in sorted(tests)]
        for kind, name, probe in probes:
            try:
                self._env.render_str(probe, x=None)
            except minijinja.TemplateError as e:
                # other errors (missing arguments, bad values) mean the name exists
                if e.kind in ("UnknownFilter", "UnknownTest"):
                    raise TemplateError(f"chat template uses an unknown {kind}: {name}") from e
            except TemplateRenderError:
                pass  # our tojson refused the probe's value: it exists

    def _trial_render(self, tools: list[dict[str, object]] | None) -> None:
        """Render a sample conversation: unknown functions and methods show up only at run time."""
        try:
            self.render(_SAMPLE, add_generation_prompt=True, tools=tools)
        except TemplateRenderError as e:
            # the template's own raise_exception (e.g. "system role not supported") judges the
            # conversation, not the template; an engine error means the template is broken
            if isinstance(e.__cause__, minijinja.TemplateError):
                message = e.__cause__.message
                raise TemplateError(
                    f"chat template fails on a sample conversation: {message}"
                ) from e

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, object]] | None = None,
        variables: Mapping[str, object] | None = None,
    ) -> str:
        """The prompt text of a conversation, ending with the assistant's opening if asked
        (the arguments as the module docstring describes them)."""
        name = _TOOL_USE if tools is not None and self._tool_use else _NAME
        # transformers passes documents (None: none) and tools whatever the template reads
        context = {"documents": None, **(variables or {}), "messages": messages, "tools": tools}
        context["add_generation_prompt"] = add_generation_prompt
        try:
            rendered: str = self._env.render_template(name, **context)
        except minijinja.TemplateError as e:
            raise TemplateRenderError(f"chat template failed: {e.message}") from e
        return rendered

"""Structured outputs: a request's output constraint as one grammar for the core.

`response_format` (OpenAI), vLLM's `structured_outputs` extra (`json`, `regex`, `choice`,
`grammar`, `json_object`) and its older `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar` all become one llguidance grammar (shared/grammar.py). Each is checked here
against the model's vocabulary, under the limits the core compiles with: a bad schema or
grammar is a 400 naming its field, and never reaches the core.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from frontend.openai.requests import GenerateRequest, StructuredOutputs
from frontend.openai.validation import invalid, unsupported
from shared.grammar import (
    GrammarError,
    choice_grammar,
    grammar_error,
    grammar_tokenizer,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from shared.tokenizer import Tokenizer


class Constraint(NamedTuple):
    """The grammar an output must match, the field it came from, and what it describes."""

    grammar: str
    param: str
    schema: Mapping[str, Any] | None  # the JSON schema, when the constraint is one
    strict: bool


class GrammarChecker:
    """Checks grammars against the model's vocabulary, as the core will compile them."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        eos = tokenizer.eos_ids
        # a model with no end-of-generation token cannot end a document: no grammars
        self._vocabulary = grammar_tokenizer(tokenizer, tokenizer.vocab_size, eos) if eos else None

    def check(self, param: str, build: Callable[[], str]) -> str:
        """The grammar `build` makes, or a 400 naming `param` with llguidance's reason."""
        if self._vocabulary is None:
            raise unsupported(param, "This model has no end-of-generation token to end a grammar.")
        try:
            grammar = build()
        except GrammarError as e:
            raise invalid(param, f"Invalid '{param}': {e}") from None
        error = grammar_error(grammar, self._vocabulary)
        if error is not None:
            raise invalid(param, f"Invalid '{param}': {error}")
        return grammar


def output_constraint(req: GenerateRequest, checker: GrammarChecker) -> Constraint | None:
    """The one output constraint of a request (None for free text); 400 if it gives two."""
    found = _response_format(req, checker)
    found += _structured_outputs(req.structured_outputs, checker)
    guided = (
        ("guided_json", req.guided_json),
        ("guided_regex", req.guided_regex),
        ("guided_choice", req.guided_choice),
        ("guided_grammar", req.guided_grammar),
    )
    found += [_guided(name, value, checker) for name, value in guided if value is not None]
    if len(found) > 1:
        raise invalid(
            found[1].param,
            f"Give one output constraint: '{found[0].param}' and '{found[1].param}' both are.",
        )
    return found[0] if found else None


def _response_format(req: GenerateRequest, checker: GrammarChecker) -> list[Constraint]:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        grammar = checker.check("response_format", json_object_grammar)
        return [Constraint(grammar, "response_format", {"type": "object"}, strict=True)]
    if fmt.type != "json_schema":
        raise invalid(
            "response_format.type",
            f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{fmt.type}'.",
        )
    if fmt.json_schema is None:
        raise invalid(
            "response_format.json_schema", "'json_schema' is required with type 'json_schema'."
        )
    schema = fmt.json_schema.schema if fmt.json_schema.schema is not None else {"type": "object"}
    strict = bool(fmt.json_schema.strict)
    param = "response_format.json_schema.schema"
    grammar = checker.check(param, lambda: json_schema_grammar(schema, lenient=not strict))
    return [Constraint(grammar, param, schema, strict)]


def _structured_outputs(
    given: StructuredOutputs | None, checker: GrammarChecker
) -> list[Constraint]:
    if given is None:
        return []
    fields = (
        ("json", given.json),
        ("regex", given.regex),
        ("choice", given.choice),
        ("grammar", given.grammar),
        ("json_object", given.json_object or None),
    )
    return [
        _guided(f"structured_outputs.{name}", value, checker)
        for name, value in fields
        if value is not None
    ]


def _guided(param: str, value: object, checker: GrammarChecker) -> Constraint:
    """One vLLM constraint; `param` names its field (its last part says which kind it is)."""
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind == "json":
        schema = _schema(param, value)
        # vLLM's extras carry no `strict`: keywords llguidance lacks are ignored, not refused
        grammar = checker.check(param, lambda: json_schema_grammar(schema, lenient=True))
        return Constraint(grammar, param, schema, strict=False)
    if kind == "json_object":
        grammar = checker.check(param, json_object_grammar)
        return Constraint(grammar, param, {"type": "object"}, strict=True)
    assert isinstance(value, str | list)  # the request's types
    builders: dict[str, Callable[[], str]] = {
        "regex": lambda: regex_grammar(str(value)),
        "choice": lambda: choice_grammar([str(v) for v in value]),
        "grammar": lambda: lark_grammar(str(value)),
    }
    return Constraint(checker.check(param, builders[kind]), param, None, strict=True)


def _schema(param: str, value: object) -> Mapping[str, Any]:
    """A JSON schema given as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise invalid(param, f"'{param}' is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise invalid(param, f"'{param}' must be a JSON schema object.")
    return value

"""Structured outputs in the frontend: each way of asking for one becomes a grammar that accepts
exactly the documents asked for, and a bad schema or grammar is a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from enginecore.grammar import Grammar
from frontend.openai.requests import CompletionRequest, decode_request
from frontend.openai.structured import GrammarChecker, output_constraint
from shared.errors import ErrorCode, ServingError
from tests.fixtures.grammars import Vocabulary
from tests.unit.conftest import chat

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


def accepts(vocab: Vocabulary, grammar: Grammar, text: str) -> bool:
    """The whole text, and then nothing more, is what the grammar allows."""
    ids = vocab.tokenizer.encode(text)
    if grammar.valid_prefix(ids) != len(ids):
        return False
    grammar.accept(ids)
    return grammar.is_complete or grammar.valid_prefix([vocab.eos_ids[0]]) == 1


WAYS = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}},
     "response_format.json_schema.schema", ['{"name": "a", "n": 3}'], ['{"name": "a"}', '{"n": 3, "name": "a"}']),
    ({"response_format": {"type": "json_object"}}, "response_format", ['{"a": [1, null]}', "{}"], ["[1]", '"a"']),
    ({"structured_outputs": {"json": SCHEMA}}, "structured_outputs.json", ['{"name": "", "n": 0}'], ['{"name": "", "n": -1}']),
    ({"guided_json": json.dumps(SCHEMA)}, "guided_json", ['{"name": "b", "n": 10}'], ["{}"]),
    ({"structured_outputs": {"regex": "[0-9]{3}-[a-z]+"}}, "structured_outputs.regex", ["123-ab"], ["12-ab", "123-"]),
    ({"guided_regex": "(yes|no)!"}, "guided_regex", ["yes!", "no!"], ["maybe!"]),
    ({"structured_outputs": {"choice": ["red", "dark \"red\""]}}, "structured_outputs.choice", ["red", 'dark "red"'], ["blue"]),
    ({"guided_choice": ["a", "b"]}, "guided_choice", ["a"], ["ab"]),
    ({"structured_outputs": {"grammar": 'start: "x" NUM\nNUM: /[0-9]+/'}}, "structured_outputs.grammar", ["x12"], ["x"]),
    ({"guided_grammar": 'root ::= "y" [0-9]+'}, "guided_grammar", ["y7"], ["7"]),  # GBNF
    ({"structured_outputs": {"json_object": True}}, "structured_outputs.json_object", ["{}"], ["1"]),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "good", "bad"), WAYS, ids=[w[1] for w in WAYS])
def test_every_way_of_asking_becomes_a_grammar_of_exactly_those_outputs(
    vocab: Vocabulary,
    checker: GrammarChecker,
    fields: dict[str, Any],
    param: str,
    good: list[str],
    bad: list[str],
) -> None:
    constraint = output_constraint(chat(**fields), checker)
    assert constraint is not None and constraint.param == param
    compiler = vocab.compiler()
    for text in good:
        assert accepts(vocab, compiler.compile(constraint.grammar), text), text
    for text in bad:
        assert not accepts(vocab, compiler.compile(constraint.grammar), text), text


def test_text_and_nothing_are_free_text(checker: GrammarChecker) -> None:
    assert output_constraint(chat(), checker) is None
    assert output_constraint(chat(response_format={"type": "text"}), checker) is None
    completion = decode_request(
        json.dumps({"model": "m", "prompt": "x", "guided_regex": "a+"}).encode(), CompletionRequest
    )
    assert output_constraint(completion, checker) is not None


BAD = [
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    # llguidance lacks `uniqueItems`: refused when strict, ignored otherwise
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": True,
      "schema": {"type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema"),
    ({"structured_outputs": {"json": {"minimum": 5, "maximum": 1, "type": "integer"}}}, "structured_outputs.json"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": "[1]"}, "guided_json"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: nowhere"}, "guided_grammar"),
    ({"structured_outputs": {"grammar": 'root ::= ("x"'}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[b[1] for b in BAD])
def test_a_bad_constraint_is_a_400_naming_its_field(
    checker: GrammarChecker, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(ServingError) as refused:
        output_constraint(chat(**fields), checker)
    assert (refused.value.http_status, refused.value.code, refused.value.param) == (
        400,
        ErrorCode.INVALID_VALUE,
        param,
    )


def test_a_schema_not_marked_strict_ignores_what_llguidance_lacks(
    vocab: Vocabulary, checker: GrammarChecker
) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 2}
    fields = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    }
    constraint = output_constraint(chat(**fields), checker)
    assert constraint is not None and not constraint.strict
    assert accepts(vocab, vocab.compiler().compile(constraint.grammar), "[1, 2]")

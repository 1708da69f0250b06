"""Grammars of constrained decoding (llguidance), as both processes build and check them.

The frontend turns a request's output constraint (a JSON schema, a regex, a list of choices, a
Lark or GBNF grammar, a tool-call format) into one grammar string and checks it here, under the
very limits the core compiles it with; the core then builds one matcher per constrained request
from that string and the model's vocabulary (`grammar_tokenizer`). The string is opaque to
everything in between: it travels in SamplingParams.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import llguidance

from shared.tokenizer import Tokenizer

# JSON is written the way json.dumps writes it: one line, ", " and ": ". Free whitespace would
# let a small model pad a document with newlines until max_tokens.
JSON_OPTIONS: Final[Mapping[str, object]] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
MAX_GRAMMAR_CHARS: Final = 1 << 20  # a grammar string longer than this is refused unread


class GrammarError(ValueError):
    """A constraint that cannot be made into a grammar, with llguidance's reason."""


def parser_limits() -> llguidance.LLParserLimits:
    """What one grammar may cost: fuel bounds its compile time, sizes bound its memory.

    Fuel is llguidance's unit of work (~50k a millisecond when compiling, ~14k per mask step):
    compiling stops after ~20 ms, a mask step after ~7 ms, and a grammar that hits either is
    an error for its request only.
    """
    return llguidance.LLParserLimits(
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=100_000,
        step_max_items=20_000,
        max_lexer_states=50_000,
        max_grammar_size=200_000,
    )


def json_options(lenient: bool) -> dict[str, object]:
    """The options a schema carries (its `x-guidance`): JSON_OPTIONS, lenient or not.

    Lenient compiling ignores keywords llguidance does not implement (`not`, `uniqueItems`):
    right for schemas the client did not mark strict, which OpenAI does not guarantee either.
    """
    return {**JSON_OPTIONS, "lenient": lenient}


def json_schema_grammar(schema: Mapping[str, Any], lenient: bool) -> str:
    """The grammar of JSON documents valid for `schema`."""
    options: Any = json_options(lenient)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
    except ValueError as e:
        raise GrammarError(str(e)) from None


def json_object_grammar() -> str:
    """Any JSON object (`response_format: {"type": "json_object"}`)."""
    return json_schema_grammar({"type": "object"}, lenient=False)


def regex_grammar(regex: str) -> str:
    """Text that matches `regex` whole (Rust regex syntax, as Python's for common patterns)."""
    return llguidance.LLMatcher.grammar_from_regex(regex)


def choice_grammar(choices: Sequence[str]) -> str:
    """Exactly one of `choices`."""
    if not choices:
        raise GrammarError("the list of choices is empty")
    return lark_alternatives("start", choices)


def lark_grammar(text: str) -> str:
    """A Lark grammar (llguidance's dialect) or a llama.cpp GBNF grammar (`root ::= ...`)."""
    try:
        return llguidance.grammar_from("grammar", text)
    except ValueError as e:
        raise GrammarError(str(e)) from None


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text)


def lark_alternatives(rule: str, texts: Iterable[str]) -> str:
    """A Lark rule matching exactly one of `texts`."""
    return f"{rule}: " + " | ".join(lark_literal(t) for t in texts)


def grammar_error(grammar: str, tokenizer: llguidance.LLTokenizer) -> str | None:
    """Why the core would refuse `grammar` (None if it compiles within the limits)."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        return f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters"
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=parser_limits()
    )
    return messages[0] if is_error else None


class _Vocabulary:
    """What llguidance reads of a tokenizer: each id's bytes, specials, EOS, and encode()."""

    is_tokenizer_wrapper = True

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> None:
        tokens = tokenizer.vocabulary()[:vocab_size]
        # ids past the tokenizer's (a padded embedding) have no bytes: never allowed
        self.tokens = tokens + [b""] * (vocab_size - len(tokens))
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tokenizer.bos_id
        # special tokens never match text: `<|im_end|>` written out is not the token
        added = tokenizer.hf.get_added_tokens_decoder()
        self.special_token_ids = sorted(i for i, t in added.items() if t.special and i < vocab_size)
        self._tokenizer = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        """Token ids of a text (llguidance passes a valid UTF-8 prefix, as str)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)


def grammar_tokenizer(
    tokenizer: Tokenizer, vocab_size: int, eos_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """The vocabulary as llguidance masks it: `vocab_size` ids, `eos_ids` end a document."""
    assert eos_ids, "a grammar needs an end-of-generation token"
    vocabulary: Any = _Vocabulary(tokenizer, vocab_size, eos_ids)
    return llguidance.LLTokenizer(vocabulary, n_vocab=vocab_size, eos_token=list(eos_ids))

"""The core's grammars: one matcher per request, masks (with drafts), accepted tokens, and the
properties of the whole path (LogitsMasker then Sampler) on the tiny and bundled vocabularies."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enginecore.grammar import Grammar, MatcherError
from enginecore.logits_mask import LogitsMasker
from enginecore.sampler import Sampler, SampleSeq
from shared.grammar import (
    MAX_GRAMMAR_CHARS,
    GrammarError,
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from shared.protocol import SamplingParams
from tests.conftest import TinyModels
from tests.fixtures.grammars import Row, Vocabulary, decode_constrained

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)"


@pytest.fixture(scope="module")
def byte_vocab(tiny: TinyModels) -> Vocabulary:
    return Vocabulary.of(tiny.hf)


@pytest.fixture(scope="module")
def smol_vocab(bundled_model: Path) -> Vocabulary:
    return Vocabulary.of(bundled_model)


def ids(vocab: Vocabulary, text: str) -> list[int]:
    return vocab.tokenizer.encode(text)


def allowed(vocab: Vocabulary, grammar: Grammar, drafts: list[int] = ()) -> np.ndarray:  # type: ignore[assignment]
    """Which tokens the masker leaves finite, one row per draft prefix."""
    logits = np.zeros((len(drafts) + 1, vocab.size), np.float32)
    row = Row(SamplingParams(max_tokens=8))
    LogitsMasker(vocab.size).apply(
        logits, [SampleSeq(row, len(drafts) + 1, drafts, grammar=grammar)]
    )
    return np.isfinite(logits)


# ---- one matcher per request ------------------------------------------------------------


def test_a_grammar_is_refused_with_llguidances_reason(byte_vocab: Vocabulary) -> None:
    compiler = byte_vocab.compiler()
    with pytest.raises(GrammarError, match="unknown name"):
        compiler.compile(lark_grammar("start: foo"))
    with pytest.raises(GrammarError, match="longer than"):
        compiler.compile("x" * (MAX_GRAMMAR_CHARS + 1))
    compiler.compile(json_object_grammar())
    assert compiler.num_compiled == 2  # the oversized one was never compiled
    assert compiler.compile_seconds_total > 0


def test_accept_counts_tokens_until_the_document_is_complete(byte_vocab: Vocabulary) -> None:
    grammar = byte_vocab.compiler().compile(choice_grammar(["yes", "no"]))
    assert not grammar.is_complete
    assert grammar.accept(ids(byte_vocab, "ye")) == 2
    # "s" completes it: whatever was sampled after it (an EOS bonus token) does not count
    assert grammar.accept([*ids(byte_vocab, "s"), 256]) == 1
    assert grammar.is_complete


def test_a_refused_token_fails_the_matcher(byte_vocab: Vocabulary) -> None:
    grammar = byte_vocab.compiler().compile(choice_grammar(["yes"]))
    with pytest.raises(MatcherError):
        grammar.accept(ids(byte_vocab, "no"))


def test_drafts_are_cut_at_the_first_token_the_grammar_forbids(byte_vocab: Vocabulary) -> None:
    grammar = byte_vocab.compiler().compile(regex_grammar("[a-c]+"))
    assert grammar.valid_prefix(ids(byte_vocab, "abcab")) == 5
    assert grammar.valid_prefix(ids(byte_vocab, "abxab")) == 2
    assert grammar.valid_prefix([]) == 0


def test_draft_rows_are_masked_as_if_each_draft_prefix_were_the_output(
    smol_vocab: Vocabulary,
) -> None:
    compiler = smol_vocab.compiler()
    grammar = compiler.compile(json_schema_grammar(PERSON, lenient=False))
    drafts = ids(smol_vocab, '{"name": "Bo')
    rows = allowed(smol_vocab, grammar, drafts)
    step = compiler.compile(json_schema_grammar(PERSON, lenient=False))
    for j in range(len(drafts) + 1):
        np.testing.assert_array_equal(rows[j], allowed(smol_vocab, step)[0])
        if j < len(drafts):
            assert step.accept([drafts[j]]) == 1
    # the drafts were rolled back: the request's own matcher is where it was
    np.testing.assert_array_equal(allowed(smol_vocab, grammar)[0], rows[0])
    assert grammar.valid_prefix(drafts) == len(drafts)


def test_a_failing_grammar_fails_only_its_own_rows(
    byte_vocab: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = byte_vocab.compiler()
    broken, fine = compiler.compile(regex_grammar("a+")), compiler.compile(regex_grammar("b+"))

    real = Grammar.fill_masks

    def fill_masks(self: Grammar, *args: Any) -> None:
        if self is broken:
            raise RuntimeError("out of fuel")
        real(self, *args)

    monkeypatch.setattr(Grammar, "fill_masks", fill_masks)
    logits = np.zeros((3, byte_vocab.size), np.float32)
    row = Row(SamplingParams(max_tokens=8, temperature=0.0))
    seqs = [
        SampleSeq(row, 1, [], grammar=broken),
        SampleSeq(row, 1, []),
        SampleSeq(row, 1, [], grammar=fine),
    ]
    LogitsMasker(byte_vocab.size).apply(logits, seqs)
    assert np.isneginf(logits[0]).all()
    assert np.isfinite(logits[1]).all()
    assert np.flatnonzero(np.isfinite(logits[2])).tolist() == ids(byte_vocab, "b")
    out = Sampler(byte_vocab.size).emit(logits, seqs)
    assert [o.failed for o in out] == [True, False, False]
    assert out[2].token_ids == ids(byte_vocab, "b")


def test_rows_that_score_the_prompt_are_not_masked(byte_vocab: Vocabulary) -> None:
    """prompt_logprobs: a sequence's first rows score its prompt tokens; only the row it
    samples from follows the grammar."""
    grammar = byte_vocab.compiler().compile(regex_grammar("b+"))
    logits = np.zeros((4, byte_vocab.size), np.float32)
    row = Row(SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0))
    seqs = [SampleSeq(row, 1, []), SampleSeq(row, 3, [], [5, 6], grammar=grammar)]
    LogitsMasker(byte_vocab.size).apply(logits, seqs)
    assert np.isfinite(logits[:3]).all()
    assert np.flatnonzero(np.isfinite(logits[3])).tolist() == ids(byte_vocab, "b")
    out = Sampler(byte_vocab.size).emit(logits, seqs)
    assert out[1].token_ids == ids(byte_vocab, "b") and out[1].prompt_logprobs is not None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_extreme_penalties_never_revive_a_masked_token(temperature: float) -> None:
    """A repetition penalty that underflows float32 (the fuzzer sent 5e-324) makes the seen
    logits +-inf: masked tokens must stay -inf, and the infinite ones share the mass."""
    logits = np.random.default_rng(0).normal(0, 3, (1, 100)).astype(np.float32)
    logits[0, 50:] = -np.inf
    params = SamplingParams(max_tokens=8, repetition_penalty=5e-324, temperature=temperature)
    row = Row(params, prompt_ids=list(range(100)))
    sampler = Sampler(100)
    chosen = {
        sampler.emit(logits.copy(), [SampleSeq(row, 1, [])])[0].token_ids[0] for _ in range(50)
    }
    assert chosen and all(t < 50 and logits[0, t] > 0 for t in chosen)


def test_an_unconstrained_step_is_left_alone(byte_vocab: Vocabulary) -> None:
    masker = LogitsMasker(byte_vocab.size)
    logits = np.ones((2, byte_vocab.size), np.float32)
    row = Row(SamplingParams(max_tokens=8))
    masker.apply(logits, [SampleSeq(row, 1, []), SampleSeq(row, 1, [])])
    assert (logits == 1).all() and masker.masked_steps_total == 0


# ---- properties -------------------------------------------------------------------------

# SmolLM2's vocabulary has no token for the bytes F1..F7 (code points past U+3FFFF)
TEXT = st.text(
    st.characters(max_codepoint=0x3FFFF, blacklist_categories=("Cs",), blacklist_characters="\x7f"),
    max_size=8,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=10,
)  # fmt: skip
PEOPLE = st.fixed_dictionaries(
    {"name": st.text(st.characters(codec="ascii", categories=("L", "N", "Zs")), max_size=12),
     "age": st.integers(0, 150)},
    optional={"tags": st.lists(st.sampled_from("abc"), max_size=3),
              "email": st.from_regex(EMAIL, fullmatch=True)},
)  # fmt: skip
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _grammar_allows_every_token_of(vocab: Vocabulary, grammar: Grammar, text: str) -> None:
    tokens = ids(vocab, text)
    for token in tokens:
        assert allowed(vocab, grammar)[0][token], (text, vocab.tokenizer.decode([token]))
        assert grammar.accept([token]) == 1
    mask = allowed(vocab, grammar)[0]
    assert grammar.is_complete or mask[list(vocab.eos_ids)].any()


@FEW
@given(doc=st.dictionaries(TEXT, JSON_VALUES, max_size=4))
def test_the_mask_never_forbids_a_token_of_a_json_object(smol_vocab: Vocabulary, doc: dict) -> None:  # type: ignore[type-arg]
    grammar = smol_vocab.compiler().compile(json_object_grammar())
    _grammar_allows_every_token_of(smol_vocab, grammar, json.dumps(doc, ensure_ascii=False))


@FEW
@given(person=PEOPLE)
def test_the_mask_never_forbids_a_token_of_a_valid_document(
    smol_vocab: Vocabulary, person: dict[str, object]
) -> None:
    grammar = smol_vocab.compiler().compile(json_schema_grammar(PERSON, lenient=False))
    # llguidance writes properties in the schema's order: valid documents follow it
    ordered = {k: person[k] for k in PERSON["properties"] if k in person}  # type: ignore[attr-defined]
    _grammar_allows_every_token_of(smol_vocab, grammar, json.dumps(ordered))


@FEW
@given(address=st.from_regex(EMAIL, fullmatch=True))
def test_the_mask_never_forbids_a_token_of_a_matching_text(
    smol_vocab: Vocabulary, address: str
) -> None:
    _grammar_allows_every_token_of(
        smol_vocab, smol_vocab.compiler().compile(regex_grammar(EMAIL)), address
    )


@pytest.mark.parametrize("vocab_name", ["byte_vocab", "smol_vocab"])
@pytest.mark.parametrize("seed", range(6))
def test_every_constrained_output_is_accepted(
    request: pytest.FixtureRequest, vocab_name: str, seed: int
) -> None:
    vocab: Vocabulary = request.getfixturevalue(vocab_name)
    compiler = vocab.compiler()
    tokens, done = decode_constrained(
        vocab, compiler.compile(json_schema_grammar(PERSON, lenient=False)), seed, 400
    )
    assert done
    jsonschema.validate(json.loads(vocab.text(tokens)), PERSON)
    tokens, done = decode_constrained(vocab, compiler.compile(regex_grammar(EMAIL)), seed, 100)
    text = vocab.text([t for t in tokens if t not in vocab.eos_ids])
    assert done and re.fullmatch(EMAIL, text), text
    choices = ["red", "green", "blue"]
    tokens, done = decode_constrained(vocab, compiler.compile(choice_grammar(choices)), seed, 20)
    assert done and vocab.text([t for t in tokens if t not in vocab.eos_ids]) in choices

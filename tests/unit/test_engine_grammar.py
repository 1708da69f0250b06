"""Constrained requests through the engine's step, in-process (tests/fixtures/engine_harness.py).

The succ model writes byte i + 1 after byte i, so where a grammar cuts in is plain to see: a
forbidden successor leaves every allowed token at logit 0, and greedy takes the lowest id.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from enginecore.grammar import Grammar, MatcherError
from shared.grammar import json_object_grammar, lark_grammar, regex_grammar
from shared.protocol import FinishReason, RejectReason, SamplingParams, Submit
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import Core, greedy, make_core, tokens_of

ALPHABET = list(b"abcdefghijklmnopqrst") + list(b"abcd")  # lookup drafts "efgh..." agree with succ


def text(core: Core, rid: str) -> str:
    return bytes(t for t in tokens_of(core.events(), rid) if t < 256).decode()


def finish(core: Core, rid: str) -> FinishReason | None:
    return next(ev.finish for ev in core.events() if ev.rid == rid and ev.finish is not None)


def test_a_complete_grammar_finishes_the_request_without_an_eos(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("done", list(b"abc"), greedy(40, grammar=regex_grammar("defg"))))
    core.send(Submit("long", list(b"abc"), greedy(8, grammar=regex_grammar("[d-f]+z"))))
    core.send(Submit("free", list(b"abc"), greedy(5)))
    core.run_until_idle()
    assert (text(core, "done"), finish(core, "done")) == ("defg", FinishReason.STOP)
    # "g" is forbidden: every allowed logit ties at 0 and the lowest id, "d", wins
    assert (text(core, "long"), finish(core, "long")) == ("defdefde", FinishReason.LENGTH)
    assert text(core, "free") == "defgh"
    s = core.stats()
    assert s.constrained_requests_total == 2 and s.grammar_compile_seconds_total > 0
    assert s.grammar_masked_steps_total >= 8 and s.kv_blocks_used == 0


def test_a_grammar_the_core_refuses_fails_only_that_request(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("bad", list(b"abc"), greedy(4, grammar=lark_grammar("start: nowhere"))))
    core.send(Submit("good", list(b"abc"), greedy(4)))
    core.run_until_idle()
    (rejected,) = core.rejected()
    assert rejected.rid == "bad" and rejected.reason == RejectReason.INVALID
    assert rejected.message.startswith("grammar:") and "nowhere" in rejected.message
    assert text(core, "good") == "defg"


def test_a_matcher_that_fails_mid_generation_ends_only_its_request(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Grammar.accept
    calls = {"n": 0}

    def accept(self: Grammar, token_ids: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise MatcherError("out of fuel")
        return real(self, token_ids)

    monkeypatch.setattr(Grammar, "accept", accept)
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("fails", list(b"abc"), greedy(10, grammar=regex_grammar("[a-z]+"))))
    core.send(Submit("other", list(b"abc"), greedy(6)))
    core.run_until_idle()
    assert finish(core, "fails") == FinishReason.ERROR
    assert text(core, "fails") == "de"
    assert (text(core, "other"), finish(core, "other")) == ("defghi", FinishReason.LENGTH)


GRAMMARS = {
    "all drafts allowed": regex_grammar("[a-z]{0,30}"),
    "drafts cut": regex_grammar("efgh[^ij][a-z]*"),
    "optional detour": regex_grammar("efghij(xyz)?k[a-z]*q"),
}


@pytest.mark.parametrize("grammar", list(GRAMMARS.values()), ids=list(GRAMMARS))
def test_prompt_lookup_gives_the_same_greedy_constrained_output(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, grammar: str
) -> None:
    outputs = []
    for spec in (False, True):
        core = make_core(tiny.succ, monkeypatch, spec=spec)
        core.send(Submit("g", ALPHABET, greedy(24, grammar=grammar)))
        core.run_until_idle()
        outputs.append((tokens_of(core.events(), "g"), finish(core, "g")))
        if spec:
            assert core.stats().spec_proposed_total > 0
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_prompt_lookup_gives_the_same_json_on_a_random_model(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    params = SamplingParams(
        max_tokens=60, temperature=temperature, seed=7, grammar=json_object_grammar()
    )
    prompt = list(b'{"a": "b", "a": "b", "a": "b", "a": "b"}')
    outputs = []
    for spec in (False, True):
        core = make_core(tiny.gguf_quant, monkeypatch, spec=spec)
        core.send(Submit("j", prompt, params))
        core.run_until_idle()
        outputs.append((text(core, "j"), finish(core, "j")))
        assert (core.stats().spec_proposed_total > 0) == spec
    assert outputs[0] == outputs[1]
    if outputs[0][1] == FinishReason.STOP:
        assert isinstance(json.loads(outputs[0][0]), dict)


def test_each_choice_follows_the_grammar_with_a_matcher_of_its_own(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n = 4 sampled choices share one prefill; each is held to the grammar on its own (a
    shared matcher would refuse the second choice's first token, or let it wander)."""
    core = make_core(tiny.gguf_quant, monkeypatch, max_num_seqs=4, num_blocks=128)
    params = SamplingParams(
        max_tokens=20, temperature=1.0, seed=3, grammar=regex_grammar("[a-d]{6}")
    )
    core.send(Submit("n", list(b"abc"), params, n=4))
    core.run_until_idle()
    texts: dict[int, bytes] = {}
    finishes = {}
    for ev in core.events():
        if ev.rid == "n":
            texts[ev.index] = texts.get(ev.index, b"") + bytes(ev.token_ids)
            if ev.finish is not None:
                finishes[ev.index] = ev.finish
    assert sorted(texts) == [0, 1, 2, 3]
    assert all(re.fullmatch(rb"[a-d]{6}", t) for t in texts.values()), texts
    assert len(set(texts.values())) > 1  # sampled: the choices differ
    assert set(finishes.values()) == {FinishReason.STOP}
    assert core.stats().constrained_requests_total == 4

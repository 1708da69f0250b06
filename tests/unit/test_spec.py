"""Prompt-lookup proposer against a brute-force reference; acceptance keeps the target distribution."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginecore.request import Request
from enginecore.sampler import (
    Distribution,
    Sampler,
    SampleSeq,
    accept_drafts,
    draw,
    make_generator,
)
from enginecore.spec import NgramProposer, drafts_allowed, record_verification
from shared.protocol import SamplingParams

CHI2_999 = {4: 18.47, 19: 43.82}  # chi-square critical values at p = 0.001, by degrees of freedom
VOCAB = 5


@dataclass
class Row:
    params: SamplingParams
    generator: np.random.Generator
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)


def sp(**kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=64, **kw)  # type: ignore[arg-type]


def chi2(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def brute_propose(ids: list[int], max_n: int, min_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if len(ids) <= n:
            continue
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):  # latest first, must have a follower
            if ids[start : start + n] == suffix:
                seq = list(ids)
                for i in range(k):  # copying may run on into the drafts themselves
                    seq.append(seq[start + n + i])
                return seq[len(ids) :]
    return []


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([1, 2, 3, 9, 1, 2, 3], [9, 1, 2]),
        ([1, 2, 1, 2], [1, 2, 1]),  # a periodic tail copies on into its own drafts
        ([7, 8, 5, 5, 7, 8, 6, 7, 8], [6, 7, 8]),  # the latest of two equal-length matches
        ([1, 2, 3, 4, 0, 2, 3, 5, 9, 9, 2, 3], [5, 9, 9]),
        ([4, 2, 3, 7, 1, 2, 3, 8, 2, 3], [8, 2, 3]),
        ([6, 1, 2, 3, 5, 0, 2, 3, 4, 1, 2, 3], [5, 0, 2]),  # the longer match beats the later one
        ([1, 2, 3, 4], []),
        ([5, 5, 5, 5], [5, 5, 5]),  # the match may overlap the suffix itself
        ([9, 4, 6, 4, 6], [4, 6, 4]),
        ([3, 1, 2, 1], []),  # a lone 1-gram is below min_ngram
        ([1, 2], []),
    ],
)
def test_propose_examples(ids: list[int], expected: list[int]) -> None:
    assert NgramProposer(max_ngram=3, min_ngram=2, num_tokens=3).propose(ids) == expected


@settings(max_examples=400, deadline=None)
@given(
    ids=st.lists(st.integers(0, 3), max_size=60),
    max_n=st.integers(1, 5),
    span=st.integers(0, 4),
    k=st.integers(1, 6),
)
def test_propose_matches_brute_force(ids: list[int], max_n: int, span: int, k: int) -> None:
    min_n = max(1, max_n - span)
    got = NgramProposer(max_n, min_n, k).propose(np.array(ids, dtype=np.int32))
    assert got == brute_propose(ids, max_n, min_n, k)


def accept_greedy(drafts: list[int], targets: list[int]) -> list[int]:
    assert len(targets) == len(drafts) + 1
    return accept_drafts(drafts, targets.__getitem__)


def accept_sampled(drafts: list[int], p: np.ndarray, g: np.random.Generator) -> list[int]:
    """The acceptance rule against target distributions p (k+1, vocab), drawn as a step does."""

    def target(j: int) -> int:
        ids = np.flatnonzero(p[j])
        return draw(Distribution(ids, p[j][ids]), g.random())

    return accept_drafts(drafts, target)


def test_accept_greedy() -> None:
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]
    assert accept_greedy([4, 5, 6], [4, 9, 6, 7]) == [4, 9]
    assert accept_greedy([4, 5, 6], [1, 5, 6, 7]) == [1]
    assert accept_greedy([], [3]) == [3]


def fixed_probs(seed: int, rows: int) -> np.ndarray:
    p = np.random.default_rng(seed).dirichlet(np.ones(VOCAB), size=rows)
    return p / p.sum(axis=1, keepdims=True)


def test_accept_sampled_first_token_follows_target() -> None:
    p = fixed_probs(0, 3)  # (k+1, V) with k = 2
    p[0] = [0.1, 0.4, 0.2, 0.25, 0.05]
    n = 30_000
    for draft in (1, 4):  # a likely and an unlikely draft
        firsts = [accept_sampled([draft, 2], p, make_generator(s))[0] for s in range(n)]
        counts = np.bincount(firsts, minlength=VOCAB)
        assert chi2(counts, p[0]) < CHI2_999[4], (draft, counts / n)


def test_accept_sampled_joint_of_two_tokens_follows_target() -> None:
    p = fixed_probs(1, 3)
    drafts = [int(np.argmax(p[0])), 0]
    pairs = np.zeros((VOCAB, VOCAB))
    for s in range(30_000):
        out = accept_sampled(drafts, p, make_generator(s))
        if out[0] == drafts[0]:
            assert len(out) >= 2
            pairs[out[0], out[1]] += 1
        else:
            assert len(out) == 1
    row = pairs[drafts[0]]
    assert chi2(row, p[1]) < CHI2_999[4]  # given an accepted d_0, the next token is ~ p_1
    assert row.sum() / 30_000 == pytest.approx(p[0, drafts[0]], abs=0.015)


def test_accept_sampled_spends_one_uniform_per_emitted_token() -> None:
    p = fixed_probs(2, 4)
    for s in range(50):
        g, ref = make_generator(s), make_generator(s)
        out = accept_sampled([0, 1, 2], p, g)
        for _ in out:
            ref.random()
        assert g.random() == ref.random()


def toy_logits(context: list[int], vocab: int = 12) -> np.ndarray:
    """A deterministic toy model: logits depend on the last two tokens, so text repeats."""
    a, b = (context[-2:] if len(context) >= 2 else [0, *context])[-2:]
    rng = np.random.default_rng(1 + a * 31 + b)
    return rng.normal(0, 2.0, vocab).astype(np.float32)


def generate(
    params: SamplingParams, seed: int, prompt: list[int], steps: int, spec: bool
) -> list[int]:
    sampler, proposer = Sampler(12), NgramProposer(3, 1, 4)
    row = Row(params, make_generator(seed), prompt, [])
    while len(row.output_ids) < steps:
        ctx = row.prompt_ids + row.output_ids
        drafts = proposer.propose(ctx) if spec else []
        logits = np.stack([toy_logits(ctx + drafts[:j]) for j in range(len(drafts) + 1)])
        (out,) = sampler.emit(logits, [SampleSeq(row, len(drafts) + 1, drafts)])
        row.output_ids += out.token_ids
    return row.output_ids[:steps]


@pytest.mark.parametrize(
    "params",
    [
        sp(temperature=0.0),
        sp(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.2),
        sp(temperature=0.9, top_k=5),
        sp(temperature=1.0, top_p=0.8, presence_penalty=0.5),
    ],
    ids=["greedy", "greedy+penalties", "top_k", "top_p+penalties"],
)
def test_speculative_decoding_equals_plain_decoding(params: SamplingParams) -> None:
    for seed in range(5):
        plain = generate(params, seed, [1, 2, 3, 1, 2], 60, spec=False)
        assert generate(params, seed, [1, 2, 3, 1, 2], 60, spec=True) == plain


def test_speculation_emits_several_tokens_per_step_on_repetitive_text() -> None:
    sampler, proposer = Sampler(12), NgramProposer(3, 1, 4)
    row = Row(sp(temperature=0.0), make_generator(0), [1, 2, 3, 1, 2])
    steps = 0
    while len(row.output_ids) < 60:
        ctx = row.prompt_ids + row.output_ids
        drafts = proposer.propose(ctx)
        logits = np.stack([toy_logits(ctx + drafts[:j]) for j in range(len(drafts) + 1)])
        (out,) = sampler.emit(logits, [SampleSeq(row, len(drafts) + 1, drafts)])
        row.output_ids += out.token_ids
        steps += 1
    assert steps < 30  # a greedy toy model cycles, so prompt lookup must pay off


def test_draft_length_follows_acceptance_and_pauses_after_a_miss() -> None:
    params = SamplingParams(max_tokens=100)
    req = Request("r", b"fe", [1], params, frozenset(), 0, 0.0, None, make_generator(0))
    lengths = []
    for proposed_ok in [True, True, True, True, False]:  # all accepted four times, then 1 of n
        n = drafts_allowed(req)
        lengths.append(n)
        record_verification(req, n, n if proposed_ok else 1, max_drafts=16)
    assert lengths == [2, 4, 8, 16, 16]
    assert drafts_allowed(req) == 1  # cut to what was accepted
    record_verification(req, 1, 0, max_drafts=16)  # a miss: 8 steps without drafts
    assert [drafts_allowed(req) for _ in range(9)] == [0] * 8 + [1]
    record_verification(req, 1, 0, max_drafts=16)  # missing again: the pause doubles
    assert [drafts_allowed(req) for _ in range(17)] == [0] * 16 + [1]
    for _ in range(5):
        record_verification(req, 1, 0, max_drafts=16)
    assert req.draft_pause == 64  # at most
    record_verification(req, 1, 1, max_drafts=16)  # a hit ends the back-off
    assert (req.draft_len, req.draft_backoff) == (2, 0)

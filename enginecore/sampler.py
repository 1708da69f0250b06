"""Sampler: one token per logits row, from each request's params, history and random stream.

Pipeline of one sampled row (vLLM v1's order): penalties on the raw logits, then temperature,
then min-p and top-k (both are thresholds on the logit, so they commute), then top-p on the
renormalized survivors. The result is a `Distribution` whose ids are ascending; a token is
drawn from it by inverse CDF with exactly one uniform from the request's generator, so a
seeded request samples the same tokens whatever else is in the batch. Greedy consumes no draw.

Logprobs are the log-softmax of the RAW model logits (vLLM v1's default `raw_logprobs`): they
describe the model, not the sampling settings, and never come out as -inf. Prompt logprobs are
the same, from the rows of prompt positions: row p scores prompt token p + 1.

`logit_bias` is added to the raw logits after the penalties (OpenAI: before sampling, so it
steers greedy choices too); until `min_tokens` tokens are out, the stop ids are masked to -inf.

`Sampler.emit` is the one output path of a step: every sampled sequence goes through the same
acceptance rule, with or without speculative drafts. The draft distribution of prompt lookup is
deterministic (q = one-hot on the draft), so standard speculative sampling reduces to: accept
d_i with probability p_i(d_i), else emit a token from p_i with d_i zeroed, and emit a bonus
token from p_k when every draft passed. It is realised by drawing t_i ~ p_i exactly as a plain
step would (inverse CDF, one uniform) and accepting iff t_i == d_i: P(accept) = p_i(d_i) and,
given a rejection, t_i ~ p_i restricted to tokens != d_i, which is exactly
normalize(max(p_i - q_i, 0)). The output distribution is p, one uniform is spent per emitted
token, and a seeded request emits the very tokens it would without speculation. With no
drafts the rule is one plain sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from enginecore.grammar import Grammar
from shared.protocol import SamplingParams, TokenLogprob, TopLogprob

log = logging.getLogger(__name__)

GREEDY_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
TOP_P_FIRST_GUESS = 64  # top-p first looks at this many best tokens, growing x4, before a full sort

Logits = npt.NDArray[np.float32]  # (vocab,) or (rows, vocab)
Ids = npt.NDArray[np.int64]


class RowInfo(Protocol):
    """What the sampler reads from the request behind one logits row (a Request fits)."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def generator(self) -> np.random.Generator: ...
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def output_ids(self) -> Sequence[int]: ...


class SampleSeq(NamedTuple):
    """One scheduled sequence as the sampler sees it."""

    row: RowInfo
    # its logits rows: len(scored_ids) rows that only score the prompt, then the rows it
    # samples from: none mid-prompt, else 1 + len(drafts)
    num_rows: int
    drafts: Sequence[int]  # sampled row j's logits come after drafts[:j]
    scored_ids: Sequence[int] = ()  # the prompt token each scoring row is followed by
    grammar: Grammar | None = None  # its sampled rows are masked already; its tokens advance it


class Sampled(NamedTuple):
    """What one sequence emits from a step: tokens, and their logprobs when asked for."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    failed: bool = False  # sampling raised for this sequence: it ends with an error
    prompt_logprobs: list[TokenLogprob] | None = None  # of its scored_ids, when asked for


FAILED = Sampled([], None, failed=True)


class Distribution(NamedTuple):
    """The final filtered distribution: kept token ids (ascending) and their probabilities."""

    ids: Ids  # (n,) int64, ascending, every prob > 0
    probs: npt.NDArray[np.float64]  # (n,), sums to 1


def make_generator(seed: int | None) -> np.random.Generator:
    """The request's own random stream: from its seed, else from OS entropy."""
    return np.random.default_rng(seed)


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_EPS


def has_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


def adjusts_logits(params: SamplingParams) -> bool:
    """Whether `penalized` may change a row (else greedy is the raw argmax)."""
    return has_penalties(params) or bool(params.logit_bias) or params.min_tokens > 0


def draw(dist: Distribution, u: float) -> int:
    """Inverse CDF over ascending ids: the token whose CDF interval holds `u` in [0, 1)."""
    cdf = np.cumsum(dist.probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    # u * cdf[-1] can round up to cdf[-1]; the last kept token owns that point.
    return int(dist.ids[min(i, dist.ids.size - 1)])


def accept_drafts(drafts: Sequence[int], target: Callable[[int], int]) -> list[int]:
    """The drafts the target agrees with, then its correction (or the bonus token).

    target(j) is the token the request emits at position j having seen drafts[:j]; it is
    called for j = 0, 1, ... until a draft is rejected or every draft is accepted.
    """
    out: list[int] = []
    for j in range(len(drafts) + 1):
        t = target(j)
        out.append(t)
        if j == len(drafts) or t != drafts[j]:
            break
    return out


def top_ids(x: npt.NDArray[np.floating], k: int) -> Ids:
    """The k best ids by value, ties to the lowest id, in ascending id order; O(V), no sort."""
    n = x.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    thr = np.partition(x, n - k)[n - k]
    above = np.flatnonzero(x > thr)
    ties = np.flatnonzero(x == thr)[: k - above.size]
    return np.sort(np.concatenate([above, ties]))


def rank(x: npt.NDArray[np.floating], ids: Ids) -> Ids:
    """`ids` ordered by value descending, ties by id ascending."""
    return ids[np.lexsort((ids, -x[ids]))]


def penalized(
    logits_row: Logits, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]
) -> Logits:
    """The row after repetition (HF) then frequency/presence (OpenAI) penalties, the logit bias
    and the min_tokens mask on the stop ids; a copy if changed."""
    if not adjusts_logits(params):
        return logits_row
    x = logits_row.copy()
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias, dtype=np.int64, count=len(params.logit_bias))
        x[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float32, count=ids.size)
    if len(output_ids) < params.min_tokens and params.stop_token_ids:
        stops = np.asarray(params.stop_token_ids, dtype=np.int64)
        kept = x[stops].copy()
        x[stops] = -np.inf
        if np.isneginf(x).all():  # a grammar (or bias) leaves nothing but a stop: the stop wins
            x[stops] = kept
    if params.repetition_penalty != 1.0:
        # HF: over prompt + output, positive logits shrink by division, negative by multiplication.
        seen = np.unique(np.concatenate([np.asarray(prompt_ids), np.asarray(output_ids)]))
        seen = seen.astype(np.int64)
        # in float64: a penalty that underflows float32 would turn a masked -inf into NaN
        v = x[seen].astype(np.float64)
        r = params.repetition_penalty
        with np.errstate(over="ignore"):  # a logit over float32's range is +inf, as meant
            x[seen] = np.where(v > 0, v / r, v * r)
    if len(output_ids) and (params.presence_penalty or params.frequency_penalty):
        # OpenAI: generated tokens only.
        toks, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        x[toks] -= params.frequency_penalty * counts + params.presence_penalty
    return x


def filtered(x: Logits, params: SamplingParams) -> Distribution:
    """Temperature, min-p, top-k and top-p applied to (penalized) logits of a sampled row."""
    n = x.size
    k = params.top_k if 0 < params.top_k < n else n
    ids = top_ids(x, k)
    z = x[ids].astype(np.float64) / params.temperature
    zmax = z.max()
    if zmax == np.inf:  # a huge repetition penalty: the infinite logits share all the mass
        z = np.where(z == np.inf, 0.0, -np.inf)
        zmax = 0.0
    if params.min_p > 0.0:
        # p >= min_p * p_max  <=>  z >= z_max + ln(min_p): a logit threshold, no softmax needed.
        keep = z >= zmax + np.log(params.min_p)
        ids, z = ids[keep], z[keep]
    w = np.exp(z - zmax)  # unnormalized; the best token has weight 1
    if params.top_p < 1.0:
        ids, w = _top_p(ids, w, params.top_p)
    p = w / w.sum()
    if not p.all():  # drop underflowed tokens so dense and sparse views hold the same support
        ids, p = ids[p > 0], p[p > 0]
    return Distribution(ids, p)


def _top_p(
    ids: Ids, w: npt.NDArray[np.float64], top_p: float
) -> tuple[Ids, npt.NDArray[np.float64]]:
    """Keep the smallest best-first prefix holding `top_p` of the mass; ids stay ascending."""
    target = top_p * w.sum()
    n = w.size
    m = TOP_P_FIRST_GUESS
    while m < n:
        # The m best positions plus their ties: a best-first prefix, found without a full sort.
        head = np.flatnonzero(w >= np.partition(w, n - m)[n - m])
        if w[head].sum() >= target:
            break
        m *= 4
    else:
        head = np.arange(n)
    order = rank(w, head)
    cut = int(np.searchsorted(np.cumsum(w[order]), target, side="left")) + 1
    kept = np.sort(order[:cut])
    return ids[kept], w[kept]


class Sampler:
    """Greedy fast path plus per-row sampling with penalties, filters and seeded draws."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def emit(self, logits: Logits, seqs: Sequence[SampleSeq]) -> list[Sampled]:
        """Every sequence's new tokens from one forward pass, in order; logits (rows, vocab)
        holds each sequence's num_rows rows one after the other. A sequence whose sampling
        raises comes out `failed` (logged here); the others are unaffected."""
        assert logits.shape == (sum(s.num_rows for s in seqs), self.vocab_size), logits.shape
        # the greedy choice of every row at once: an all-greedy batch needs nothing else
        best: list[int] = np.argmax(logits, axis=1).tolist()
        out: list[Sampled] = []
        start = 0
        for seq in seqs:
            end = start + seq.num_rows
            try:
                out.append(self._emit_one(logits[start:end], best[start:end], seq))
            except Exception:
                log.exception("sampling failed for one sequence of the step")
                out.append(FAILED)
            start = end
        return out

    def _emit_one(self, rows: Logits, best: list[int], seq: SampleSeq) -> Sampled:
        row, num_rows, drafts, scored, grammar = seq
        prompt_logprobs = None
        if scored:
            n_prompt = row.params.prompt_logprobs or 0
            prompt_logprobs = [
                self.logprobs_row(rows[j], t, n_prompt) for j, t in enumerate(scored)
            ]
            rows, best, num_rows = rows[len(scored) :], best[len(scored) :], num_rows - len(scored)
        assert num_rows in (0, len(drafts) + 1), (num_rows, len(drafts))
        if num_rows == 0:
            return Sampled([], None, prompt_logprobs=prompt_logprobs)
        p = row.params
        if is_greedy(p) and not adjusts_logits(p):
            tokens = accept_drafts(drafts, best.__getitem__)
        else:
            tokens = accept_drafts(drafts, self._target(rows, row, drafts))
        if grammar is not None:
            del tokens[grammar.accept(tokens) :]
        n_top = p.logprobs
        logprobs = None
        if n_top is not None:
            logprobs = [self.logprobs_row(rows[j], t, n_top) for j, t in enumerate(tokens)]
        return Sampled(tokens, logprobs, prompt_logprobs=prompt_logprobs)

    def _target(self, rows: Logits, row: RowInfo, drafts: Sequence[int]) -> Callable[[int], int]:
        """The token a plain step would emit at position j, having seen drafts[:j]."""

        def target(j: int) -> int:
            seen = row.output_ids if j == 0 else [*row.output_ids, *drafts[:j]]
            return self.sample_row(rows[j], row.params, row.generator, seen, row.prompt_ids)

        return target

    def sample_row(
        self,
        logits_row: Logits,
        params: SamplingParams,
        generator: np.random.Generator,
        output_ids: Sequence[int],
        prompt_ids: Sequence[int],
    ) -> int:
        """One token from one row; one uniform drawn unless greedy."""
        x = penalized(logits_row, params, prompt_ids, output_ids)
        if is_greedy(params):
            return int(np.argmax(x))
        return draw(filtered(x, params), generator.random())

    def distribution(
        self,
        logits_row: Logits,
        params: SamplingParams,
        output_ids: Sequence[int],
        prompt_ids: Sequence[int],
    ) -> Distribution:
        """The final distribution `sample_row` draws from (one-hot on the argmax when greedy)."""
        x = penalized(logits_row, params, prompt_ids, output_ids)
        if is_greedy(params):
            return Distribution(np.array([np.argmax(x)], dtype=np.int64), np.ones(1))
        return filtered(x, params)

    def probs(
        self,
        logits_row: Logits,
        params: SamplingParams,
        output_ids: Sequence[int],
        prompt_ids: Sequence[int],
    ) -> npt.NDArray[np.float64]:
        """`distribution` as a dense (vocab,) vector."""
        dist = self.distribution(logits_row, params, output_ids, prompt_ids)
        p = np.zeros(logits_row.size, dtype=np.float64)
        p[dist.ids] = dist.probs
        return p

    @staticmethod
    def logprobs_row(logits_row: Logits, token_id: int, n: int) -> TokenLogprob:
        """Raw-logit logprob of `token_id` plus the n best tokens, best first (ties: lowest id),
        and its rank (1 = the best)."""
        x = logits_row.astype(np.float64)
        m = x.max()
        lse = m + np.log(np.exp(x - m).sum())
        top = rank(x, top_ids(x, n)) if n > 0 else np.empty(0, dtype=np.int64)
        return TokenLogprob(
            token_id=token_id,
            logprob=float(x[token_id] - lse),
            top=[TopLogprob(token_id=int(t), logprob=float(x[t] - lse)) for t in top],
            rank=1 + int(np.count_nonzero(x > x[token_id])),
        )

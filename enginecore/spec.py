"""Prompt-lookup speculative decoding: NgramProposer drafts, accept() verifies them, and
emit() turns a step's logits into each sequence's new tokens.

The draft distribution is deterministic (q = one-hot on the draft), so standard speculative
sampling reduces to: accept d_i with probability p_i(d_i), else emit a token from p_i with d_i
zeroed, and emit a bonus token from p_k when every draft passed. We realise it by drawing
t_i ~ p_i with the sampler's own inverse CDF and one uniform, accepting iff t_i == d_i:
P(accept) = p_i(d_i) and, given a rejection, t_i ~ p_i restricted to tokens != d_i, which is
exactly normalize(max(p_i - q_i, 0)). The output distribution is p, one uniform is spent per
emitted token, and a seeded request emits the very tokens it would without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from enginecore.batch import SeqChunk
from enginecore.request import Request
from enginecore.sampler import Distribution, Logits, RowInfo, Sampler, draw, is_greedy

# Draft length, per request: doubled (up to the proposer's num_tokens) after a step that
# accepted every draft, cut to what was accepted otherwise; after a step that accepted none,
# no drafts for a while (8 steps, doubling while it keeps missing, at most 64). A rejected
# draft costs a forward row for nothing (~60% of a one-token decode step in the quantized
# kernels), and an n-gram match in ordinary prose is mostly wrong: fixed 4 drafts made a
# story 15% slower, while a text being repeated gains from many (bench/README.md).
FIRST_PAUSE, MAX_PAUSE = 8, 64


def drafts_allowed(req: Request) -> int:
    """How many drafts `req` may propose this step (0 while paused)."""
    if req.draft_pause > 0:
        req.draft_pause -= 1
        return 0
    return req.draft_len


def record_verification(req: Request, proposed: int, accepted: int, max_drafts: int) -> None:
    if accepted == proposed:
        req.draft_len = min(max_drafts, 2 * req.draft_len)
        req.draft_backoff = 0
    elif accepted > 0:
        req.draft_len = accepted
        req.draft_backoff = 0
    else:
        req.draft_len = 1
        req.draft_backoff = min(MAX_PAUSE, 2 * req.draft_backoff or FIRST_PAUSE)
        req.draft_pause = req.draft_backoff


class NgramProposer:
    """Drafts what followed the latest earlier occurrence of the longest suffix n-gram."""

    def __init__(self, max_ngram: int, min_ngram: int, num_tokens: int) -> None:
        assert 1 <= min_ngram <= max_ngram, (min_ngram, max_ngram)
        assert num_tokens >= 1, num_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_tokens = num_tokens

    def propose(self, token_ids: Sequence[int] | npt.NDArray[np.integer]) -> list[int]:
        """Up to num_tokens drafts to follow `token_ids` (prompt + output), or [] if no match."""
        ids = np.asarray(token_ids)
        n = ids.size
        if n <= self.min_ngram:
            return []
        # Candidate ends e < n-1 share the last token; grow each one's match length backwards.
        ends = np.flatnonzero(ids[: n - 1] == ids[n - 1])
        if ends.size == 0:
            return []
        length = np.ones(ends.size, dtype=np.int64)
        for j in range(1, min(self.max_ngram, n - 1)):
            alive = length == j
            if not alive.any():
                break
            at = ends - j
            ok = alive & (at >= 0)
            ok[ok] = ids[at[ok]] == ids[n - 1 - j]
            length += ok
        best = int(length.max())
        if best < self.min_ngram:
            return []
        e = int(ends[np.flatnonzero(length == best)[-1]])  # the most recent of the longest
        drafts = [int(t) for t in ids[e + 1 : e + 1 + self.num_tokens]]
        # A match overlapping the suffix means a periodic tail: copy on into our own drafts
        # (LZ77 style) instead of stopping at the end of the context.
        period = n - 1 - e
        while len(drafts) < self.num_tokens:
            drafts.append(drafts[len(drafts) - period])
        return drafts


def accept_greedy(drafts: Sequence[int], target_ids: Sequence[int]) -> list[int]:
    """The drafts that match the target argmaxes, then the target's correction or bonus token."""
    assert len(target_ids) == len(drafts) + 1, (len(drafts), len(target_ids))
    out: list[int] = []
    for d, t in zip(drafts, target_ids, strict=False):
        out.append(int(t))
        if t != d:
            return out
    out.append(int(target_ids[-1]))
    return out


def accept_sampled(
    drafts: Sequence[int], target_probs: npt.NDArray[np.float64], generator: np.random.Generator
) -> list[int]:
    """Speculative sampling against a one-hot draft; target_probs is (k+1, vocab)."""
    assert target_probs.shape[0] == len(drafts) + 1, (target_probs.shape, len(drafts))
    out: list[int] = []
    for i, p in enumerate(target_probs):
        ids = np.flatnonzero(p)
        t = draw(Distribution(ids, p[ids]), generator.random())
        out.append(t)
        if i == len(drafts) or t != drafts[i]:
            break
    return out


def accept(sampler: Sampler, logits: Logits, row: RowInfo, drafts: Sequence[int]) -> list[int]:
    """Tokens a request emits after verifying `drafts`; logits is (k+1, vocab), row j after drafts[:j]."""
    if is_greedy(row.params):
        return accept_greedy(drafts, sampler.target_ids(logits, row, drafts))
    return accept_sampled(drafts, sampler.target_probs(logits, row, drafts), row.generator)


class Emitted(NamedTuple):
    ids: list[list[int]]  # per scheduled sequence, in batch order
    proposed: int  # drafts verified this step
    accepted: int


def emit(
    sampler: Sampler, requests: Sequence[Request], chunks: Sequence[SeqChunk], logits: Logits
) -> Emitted:
    """The tokens each scheduled sequence emits from one forward pass, with their logprobs
    set on the request: a plain sample per sampled row, or the accepted drafts and one more."""
    starts = np.cumsum([0] + [c.num_sample for c in chunks])  # first logits row of each
    plain = [i for i, c in enumerate(chunks) if c.num_sample == 1]
    # every row sampled once (the usual decode step): no 12 MB copy of a (64, vocab) gather
    rows = logits if len(plain) == logits.shape[0] else logits[starts[plain]]
    tokens = sampler.sample(rows, [requests[i] for i in plain]).tolist()
    plain_token = dict(zip(plain, tokens, strict=True))
    ids: list[list[int]] = []
    proposed = accepted = 0
    for i, (req, chunk) in enumerate(zip(requests, chunks, strict=True)):
        rows = logits[starts[i] : starts[i] + chunk.num_sample]
        if chunk.num_sample <= 1:
            new = [plain_token[i]] if chunk.num_sample else []
        else:
            new = accept(sampler, rows, req, req.drafts)
            proposed += len(req.drafts)
            accepted += len(new) - 1
        n_top = req.params.logprobs
        req.new_logprobs = (
            []
            if n_top is None
            else [sampler.logprobs_row(rows[j], t, n_top) for j, t in enumerate(new)]
        )
        ids.append(new)
    return Emitted(ids, proposed, accepted)

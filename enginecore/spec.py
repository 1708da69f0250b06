"""Prompt-lookup speculative decoding: NgramProposer drafts, and how many drafts each request
may propose. Drafts are verified with every other sampled row, in `Sampler.emit`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from enginecore.request import Request

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

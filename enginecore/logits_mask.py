"""LogitsMasker: the rows of constrained requests get -inf where their grammar forbids a token.

It runs between the forward pass and the sampler, on the step's logits in place: each
constrained sequence fills one bitmask row per logits row it samples from (after its output,
then after each draft prefix; rows that score prompt tokens are left alone), and one numba
kernel applies them all. A step without a constrained request only looks at each sequence's
`grammar` field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from enginecore.grammar import Bitmask
from enginecore.kernels.grammar_mask import apply_token_bitmask
from enginecore.sampler import Logits, SampleSeq

log = logging.getLogger(__name__)


class LogitsMasker:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.num_words = -(-vocab_size // 32)
        self._bitmask: Bitmask = np.full((64, self.num_words), -1, np.int32)  # grows
        self.masked_steps_total = 0
        self.mask_seconds_total = 0.0

    def warmup(self) -> None:
        """Compile the kernel (or load it from the numba cache) before serving."""
        logits = np.zeros((1, self.vocab_size), np.float32)
        apply_token_bitmask(logits, np.zeros(1, np.int32), self._bitmask[:1])

    def apply(self, logits: Logits, seqs: Sequence[SampleSeq]) -> None:
        """Mask the rows (rows, vocab) of every constrained sequence, in place."""
        if all(s.grammar is None or s.num_rows == 0 for s in seqs):
            return
        t0 = time.perf_counter()
        rows: list[int] = []
        row = 0
        for seq in seqs:
            # rows that score prompt tokens come first and stay as they are
            first, num_sampled = row + len(seq.scored_ids), seq.num_rows - len(seq.scored_ids)
            if seq.grammar is not None and num_sampled:
                bitmask = self._room(len(rows) + num_sampled)
                try:
                    seq.grammar.fill_masks(bitmask, len(rows), seq.drafts)
                except Exception as e:
                    # nothing is allowed; the sampler's accept() then fails this request alone
                    log.exception("the grammar of one sequence failed")
                    seq.grammar.fail(str(e))
                    bitmask[len(rows) : len(rows) + num_sampled] = 0
                rows.extend(range(first, first + num_sampled))
            row += seq.num_rows
        k = len(rows)
        apply_token_bitmask(logits, np.asarray(rows, np.int32), self._bitmask[:k])
        self.masked_steps_total += 1
        self.mask_seconds_total += time.perf_counter() - t0

    def _room(self, num_rows: int) -> Bitmask:
        if num_rows > self._bitmask.shape[0]:
            grown = np.full((2 * num_rows, self.num_words), -1, np.int32)
            grown[: self._bitmask.shape[0]] = self._bitmask
            self._bitmask = grown
        return self._bitmask

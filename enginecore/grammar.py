"""Grammar-constrained decoding in the core: one llguidance matcher per constrained request.

A request's grammar (the opaque string of its SamplingParams) is compiled once, when the core
takes the request, under shared.grammar's limits. Each step its logits rows are masked to the
tokens the grammar allows (enginecore/logits_mask.py, before the sampler); the sampler feeds
the tokens it emits back (`accept`); prompt-lookup drafts are cut to the prefix the grammar
accepts before they are scheduled; a request whose grammar is complete finishes with `stop`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import llguidance
import numpy as np
import numpy.typing as npt

from shared.grammar import MAX_GRAMMAR_CHARS, GrammarError, parser_limits

log = logging.getLogger(__name__)

Bitmask = npt.NDArray[np.int32]  # (rows, ceil(vocab / 32)): bit t % 32 of word t // 32


class MatcherError(RuntimeError):
    """A matcher that cannot go on (a resource limit mid-generation): its request fails."""


class Grammar:
    """One constrained request's matcher, advanced over every token the request emits."""

    __slots__ = ("_error", "_matcher")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher
        self._error: str | None = None

    @property
    def is_complete(self) -> bool:
        """Nothing may follow the output so far (only EOS would): the request is done."""
        return self._matcher.is_stopped()

    def valid_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of `token_ids` (drafts) the grammar accepts after the output so far."""
        return self._matcher.validate_tokens(list(token_ids))

    def fill_masks(self, bitmask: Bitmask, first: int, drafts: Sequence[int]) -> None:
        """Row first + j of `bitmask`: the tokens allowed after the output and drafts[:j].

        The drafts were cut by `valid_prefix`, so each is consumed and then rolled back.
        """
        m = self._matcher
        for j in range(len(drafts) + 1):
            if j and not m.consume_token(drafts[j - 1]):
                raise self.fail(f"draft token {drafts[j - 1]} refused: {m.get_error()}")
            row = bitmask[first + j]
            m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if drafts and not m.rollback(len(drafts)):
            raise self.fail("the matcher could not roll its drafts back")
        if m.is_error():
            raise self.fail(m.get_error())

    def accept(self, token_ids: Sequence[int]) -> int:
        """Advance over emitted tokens; how many of them count (none past a complete grammar)."""
        if self._error is not None:
            raise MatcherError(self._error)
        m = self._matcher
        for i, token in enumerate(token_ids):
            if m.is_stopped():
                return i
            if not m.consume_token(token):
                raise MatcherError(f"token {token} refused: {m.get_error()}")
        return len(token_ids)

    def fail(self, reason: str) -> MatcherError:
        """Mark the matcher broken: the request's next `accept` raises, which ends it."""
        self._error = self._error or reason
        return MatcherError(reason)


class GrammarCompiler:
    """Builds each constrained request's matcher over the model's vocabulary; counts the cost."""

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self.tokenizer = tokenizer
        self.limits = parser_limits()
        self.num_compiled = 0  # constrained requests taken
        self.compile_seconds_total = 0.0

    def compile(self, grammar: str) -> Grammar:
        """The matcher of one request; GrammarError if the grammar is refused."""
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
        t0 = time.perf_counter()
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, limits=self.limits, log_level=0)
        seconds = time.perf_counter() - t0
        self.num_compiled += 1
        self.compile_seconds_total += seconds
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        log.debug("grammar of %d characters compiled in %.2f ms", len(grammar), seconds * 1e3)
        return Grammar(matcher)

"""Request: one generation inside the core, and its ordered lifecycle."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from enginecore.grammar import Grammar
from shared.protocol import FinishReason, RejectReason, SamplingParams


class RequestStatus(IntEnum):
    """Ordered: everything after PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


# The one table from finished states to the finish reason a client sees.
FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


def invalid_params(p: SamplingParams) -> str | None:
    """Why the sampler cannot honour `p`, or None.

    The frontend validates stricter ranges; this guards the loop (shared by every frontend)
    against a peer that did not, since e.g. min_p > 1 leaves nothing to sample from.
    """
    if not (math.isfinite(p.temperature) and p.temperature >= 0):
        return "temperature must be a finite number >= 0"
    if not (0 < p.top_p <= 1 and 0 <= p.min_p <= 1):
        return "top_p must be in (0, 1] and min_p in [0, 1]"
    if p.top_k < 0 or (p.logprobs is not None and p.logprobs < 0):
        return "top_k and logprobs must be >= 0"
    penalties = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    if not (all(map(math.isfinite, penalties)) and p.repetition_penalty > 0):
        return "penalties must be finite and repetition_penalty > 0"
    return None


def invalid_submit(
    prompt_ids: list[int], p: SamplingParams, max_model_len: int, vocab_size: int
) -> tuple[RejectReason, str] | None:
    """Why no core could serve this request whatever its state, or None."""
    n = len(prompt_ids)
    if n == 0 or p.max_tokens < 1:
        return RejectReason.INVALID, "a request needs at least one prompt token and max_tokens >= 1"
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        return RejectReason.INVALID, f"token ids must be in [0, {vocab_size})"
    if (problem := invalid_params(p)) is not None:
        return RejectReason.INVALID, problem
    if n + p.max_tokens > max_model_len:
        return (
            RejectReason.CONTEXT_LENGTH_EXCEEDED,
            f"{n} prompt tokens + {p.max_tokens} max_tokens exceed the context of {max_model_len}",
        )
    return None


@dataclass(slots=True)
class Request:
    rid: str
    client: bytes  # identity of the frontend that owns it
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]  # stop token ids plus EOS unless ignore_eos
    priority: int
    arrival: float  # time.monotonic() at admission
    deadline: float | None  # monotonic time after which a request still waiting is refused
    generator: np.random.Generator
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    num_preemptions: int = 0
    # how many drafts to propose next, and steps left without drafts (enginecore/spec.py)
    draft_len: int = 2
    draft_pause: int = 0
    draft_backoff: int = 0
    grammar: Grammar | None = None  # the matcher of params.grammar, built once when taken

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def is_prefilling(self) -> bool:
        """More than the last token is still to be computed."""
        return self.num_computed < self.num_tokens - 1

    @property
    def started(self) -> bool:
        """It has run at least once (so queue deadlines no longer apply)."""
        return self.status != RequestStatus.WAITING or self.num_preemptions > 0

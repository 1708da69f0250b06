"""Request: one generation inside the core, and its ordered lifecycle."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import msgspec
import numpy as np

from shared.protocol import FinishReason, RejectReason, SamplingParams, TokenLogprob


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
    if p.top_k < 0 or p.min_tokens < 0:
        return "top_k and min_tokens must be >= 0"
    if any(n is not None and n < 0 for n in (p.logprobs, p.prompt_logprobs)):
        return "logprobs and prompt_logprobs must be >= 0"
    if not all(math.isfinite(b) for b in p.logit_bias.values()):
        return "logit_bias values must be finite"
    penalties = (p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
    if not (all(map(math.isfinite, penalties)) and p.repetition_penalty > 0):
        return "penalties must be finite and repetition_penalty > 0"
    return None


def invalid_submit(
    prompt_ids: list[int], p: SamplingParams, max_model_len: int, vocab_size: int
) -> tuple[RejectReason, str] | None:
    """Why no core could serve this request whatever its state, or None.

    max_tokens 0 scores a prompt (its prompt logprobs) without generating.
    """
    n = len(prompt_ids)
    if n == 0 or p.max_tokens < 0:
        return RejectReason.INVALID, "a request needs at least one prompt token and max_tokens >= 0"
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        return RejectReason.INVALID, f"token ids must be in [0, {vocab_size})"
    if any(not 0 <= t < vocab_size for t in p.logit_bias):
        return RejectReason.INVALID, f"logit_bias token ids must be in [0, {vocab_size})"
    if (problem := invalid_params(p)) is not None:
        return RejectReason.INVALID, problem
    if n + p.max_tokens > max_model_len:
        return (
            RejectReason.CONTEXT_LENGTH_EXCEEDED,
            f"{n} prompt tokens + {p.max_tokens} max_tokens exceed the context of {max_model_len}",
        )
    return None


def choice_rid(rid: str, index: int) -> str:
    """The core's key of choice `index` of the request submitted as `rid` (choice 0: `rid`)."""
    return rid if index == 0 else f"{rid}#{index}"


@dataclass(slots=True)
class Request:
    rid: str  # the key of this choice (choice_rid); events name the Submit's rid
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
    cache_salt: str = ""  # its prefix-cache namespace
    # choices of one Submit (n > 1): choice 0 prefills, the others take its prompt's KV
    index: int = 0
    leader: str | None = None  # the rid of choice 0, for the others
    siblings: list[str] = field(default_factory=list)  # choice 0 only: the others' rids
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # scored so far
    scheduled_at: float | None = None  # monotonic time it was first scheduled
    reported: bool = False  # its first event is sent

    @property
    def submit_rid(self) -> str:
        """The rid its frontend submitted (and reads its events by)."""
        return self.leader or self.rid

    @property
    def scores_prompt(self) -> bool:
        """Its prompt's logprobs are asked for and not all computed: every prompt row counts."""
        return self.params.prompt_logprobs is not None and not self.output_ids and not self.reported

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


def with_choices(first: Request, n: int) -> list[Request]:
    """`first` (choice 0) and n - 1 more choices of its request.

    Each other choice has its own random stream, seeded with seed + index when the request is
    seeded (so each choice repeats whatever else runs), no deadline of its own (choice 0's
    governs the admission of them all), and no prompt logprobs (the request reports them once).
    """
    rids = [choice_rid(first.rid, i) for i in range(1, n)]
    first.siblings = rids
    out = [first]
    for i, rid in enumerate(rids, start=1):
        seed = first.params.seed
        seed = None if seed is None else (seed + i) % (1 << 64)
        params = msgspec.structs.replace(first.params, seed=seed, prompt_logprobs=None)
        out.append(
            Request(
                rid=rid,
                client=first.client,
                prompt_ids=first.prompt_ids,
                params=params,
                stop_ids=first.stop_ids,
                priority=first.priority,
                arrival=first.arrival,
                deadline=None,
                generator=np.random.default_rng(seed),
                cache_salt=first.cache_salt,
                index=i,
                leader=first.rid,
            )
        )
    return out

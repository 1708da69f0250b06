"""Request: one generation inside the core, and its ordered lifecycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from shared.protocol import FinishReason, SamplingParams, TokenLogprob


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
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    num_preemptions: int = 0
    drafts: list[int] = field(default_factory=list)  # speculative tokens fed this step
    # what the current step produced, for the event to the frontend
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def is_prefilling(self) -> bool:
        """More than the last token is still to be computed."""
        return self.num_computed < self.num_tokens - 1

    @property
    def started(self) -> bool:
        """It has run at least once (so queue deadlines no longer apply)."""
        return self.status != RequestStatus.WAITING or self.num_preemptions > 0

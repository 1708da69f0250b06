"""The wire protocol between frontends (DEALER) and the engine core (ROUTER).

Every message is a tagged, array-like msgspec Struct; one union per direction.
A reader should learn the whole frontend <-> core conversation from this file.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

MAX_CHOICES = 128  # n of one Submit at most


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """How one request samples; validated by the frontend, trusted by the core."""

    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; n >= 0 = chosen token's logprob + top n
    grammar: str | None = None  # llguidance grammar the output must match (shared/grammar.py)
    min_tokens: int = 0  # the stop ids cannot be sampled before this many tokens
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)  # added to raw logits
    # None = off; n >= 0 = each prompt token's logprob + top n (the prompt is then computed
    # whole: no prefix-cache hit), sent with the request's first event
    prompt_logprobs: int | None = None


class FinishReason(StrEnum):
    STOP = "stop"  # an EOS or stop token id
    LENGTH = "length"  # max_tokens or the context is full
    ABORT = "abort"  # the frontend asked
    ERROR = "error"  # the core failed this request


class RejectReason(StrEnum):
    QUEUE_FULL = "queue_full"
    NO_CAPACITY = "no_capacity"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    SHUTTING_DOWN = "shutting_down"
    INVALID = "invalid"
    INTERNAL = "internal"  # the core failed while taking the request; it runs no further


# ---- frontend -> core -------------------------------------------------------------------


class Hello(msgspec.Struct, tag=True, array_like=True):
    """First message of a frontend; the core answers with Welcome."""

    frontend_id: str


class Submit(msgspec.Struct, tag=True, array_like=True):
    """Generate tokens after `prompt_ids`."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0  # -100..100, higher is scheduled first
    deadline_ms: int | None = None  # reject with no_capacity if still waiting after this
    n: int = 1  # choices: one prefill, then n sequences each with its own random stream
    cache_salt: str = ""  # prefix-cache namespace: only requests of the same salt share blocks


class Abort(msgspec.Struct, tag=True, array_like=True):
    """Stop these requests (or only their choice `index`) and free their blocks before the
    next step."""

    rids: list[str]
    index: int | None = None


class Embed(msgspec.Struct, tag=True, array_like=True):
    """Mean-pooled, L2-normalized final hidden states of each input, in order."""

    rid: str
    inputs: list[list[int]]


class Heartbeat(msgspec.Struct, tag=True, array_like=True):
    """Sent every second; a silent frontend has its requests aborted."""


class GetStats(msgspec.Struct, tag=True, array_like=True):
    """Ask for a Stats message now (metrics scrape)."""


class Bye(msgspec.Struct, tag=True, array_like=True):
    """The frontend is leaving: abort everything it owns."""


class ShutdownCore(msgspec.Struct, tag=True, array_like=True):
    """Drain: admit nothing new, finish running work, exit 0. Honoured only with the token
    the spawning frontend gave the core at start (an attached frontend leaves with Bye)."""

    token: str


ToCore = Hello | Submit | Abort | Embed | Heartbeat | GetStats | Bye | ShutdownCore


# ---- core -> frontend -------------------------------------------------------------------


class Welcome(msgspec.Struct, tag=True, array_like=True):
    """What the core serves (id, limits, end-of-generation ids), sent in answer to Hello."""

    model_id: str
    max_model_len: int
    vocab_size: int
    eos_ids: list[int]
    block_size: int
    core_pid: int


class TopLogprob(msgspec.Struct, array_like=True, gc=False):
    token_id: int
    logprob: float


class TokenLogprob(msgspec.Struct, array_like=True, gc=False):
    token_id: int
    logprob: float
    top: list[TopLogprob]
    rank: int = 0  # 1 + the number of tokens with a higher logit


class TokenEvent(msgspec.Struct, array_like=True, gc=False):
    """New tokens of one choice of one request in one step (speculation may add several)."""

    rid: str
    token_ids: list[int]
    finish: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    index: int = 0  # the choice, 0 .. n - 1
    # the choice's first event only: the seconds the request waited in the queue and then spent
    # in its prefill; and choice 0's, which comes before any other choice's first event: the
    # logprobs of prompt tokens 1.. (if asked for)
    prompt_logprobs: list[TokenLogprob] | None = None
    queue_s: float = 0.0
    prefill_s: float = 0.0


class Stats(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Core gauges and counters for /metrics."""

    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    kv_blocks_cached: int = 0
    queue_depth: int = 0
    active_sequences: int = 0
    batch_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found cached
    preemptions_total: int = 0
    kv_evictions_total: int = 0
    spec_proposed_total: int = 0
    spec_accepted_total: int = 0
    steps_total: int = 0
    constrained_requests_total: int = 0  # requests taken with a grammar
    grammar_compile_seconds_total: float = 0.0
    grammar_masked_steps_total: int = 0  # steps that masked constrained rows
    grammar_mask_seconds_total: float = 0.0
    kv_blocks_total: int = 0
    prefill_tokens_total: int = 0  # prompt tokens the forward pass computed (cache hits aside)
    spec_drafts_total: int = 0  # steps of a sequence that verified drafts


class Step(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Everything one engine step produced for one frontend."""

    events: list[TokenEvent]


class Accepted(msgspec.Struct, tag=True, array_like=True):
    """The request is admitted (queued): from here on, a refusal is an event of its stream."""

    rid: str


class Rejected(msgspec.Struct, tag=True, array_like=True):
    """The core will not run this request."""

    rid: str
    reason: RejectReason
    message: str
    retry_after_s: int = 0  # when a retry may find room (queue full, no capacity, draining)


class Embedded(msgspec.Struct, tag=True, array_like=True, gc=False):
    rid: str
    vectors: list[list[float]]
    num_tokens: int


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    """The core is going away (drain finished, or a fatal error)."""

    reason: str
    fatal: bool


class Busy(msgspec.Struct, tag=True, array_like=True):
    """The core has been in one step for `seconds` and reads nothing until it ends: it is alive
    (sent about every second of a long step). Liveness only: a step that never ends keeps
    sending it, so it is no sign of progress."""

    seconds: float


ToFrontend = Welcome | Accepted | Step | Rejected | Embedded | Stats | Shutdown | Busy


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def core_decoder() -> msgspec.msgpack.Decoder[ToCore]:
    return msgspec.msgpack.Decoder(ToCore)


def frontend_decoder() -> msgspec.msgpack.Decoder[ToFrontend]:
    return msgspec.msgpack.Decoder(ToFrontend)

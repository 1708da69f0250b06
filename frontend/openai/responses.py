"""OpenAI response and stream-chunk documents, as msgspec Structs (encode with msgspec.json).

Shapes follow the OpenAI API reference; the official `openai` client parses every one.
`finish_reason` and `logprobs` are written as explicit nulls where OpenAI writes them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

import msgspec

from shared.protocol import TokenLogprob

MIN_LOGPROB: Final = -9999.0  # OpenAI's stand-in for -inf, which JSON cannot carry


class Head(NamedTuple):
    """What every document of one response repeats."""

    id: str
    created: int  # unix seconds
    model: str


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprobEntry(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobEntry]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprobEntry]


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]  # character offset of each token in the returned text


class PromptLogprob(msgspec.Struct, kw_only=True):
    """vLLM's prompt_logprobs entry of one token."""

    logprob: float
    rank: int
    decoded_token: str


# per prompt token: None for the first, else token id (as a string) -> its entry, for the
# prompt's own token and the best alternatives
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    prompt_logprobs: PromptLogprobs | None = None


class TextCompletion(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A completion, or one chunk of a streamed completion (the same shape)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: str = "embedding"
    embedding: list[float] | str  # str: base64 of little-endian float32
    index: int


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ModelEntry(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelEntry]


class TokenizeResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None  # when return_token_strs


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens),
    )


def chat_choice(
    index: int, content: str, finish_reason: str, logprobs: ChatLogprobs | None = None
) -> ChatChoice:
    message = AssistantMessage(content=content)
    return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=finish_reason)


def chat_completion(
    head: Head,
    choices: list[ChatChoice],
    usage: Usage,
    prompt_logprobs: PromptLogprobs | None = None,
) -> ChatCompletion:
    return ChatCompletion(
        **head._asdict(),
        object="chat.completion",
        choices=choices,
        usage=usage,
        prompt_logprobs=prompt_logprobs,
    )


def chat_role_chunk(head: Head, index: int = 0) -> ChatCompletionChunk:
    """The first chunk of a choice of a chat stream: the assistant role and empty content."""
    choice = ChunkChoice(index=index, delta=Delta(role="assistant", content=""))
    return ChatCompletionChunk(**head._asdict(), object="chat.completion.chunk", choices=[choice])


def chat_chunk(
    head: Head,
    content: str | None,
    finish_reason: str | None = None,
    logprobs: ChatLogprobs | None = None,
    *,
    index: int = 0,
    usage: Usage | None = None,
) -> ChatCompletionChunk:
    """A content delta; content None gives `delta: {}` (a finish with nothing left to send).
    `usage` so far rides on it when asked for (continuous_usage_stats)."""
    delta = Delta(content=content)
    choice = ChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
    return ChatCompletionChunk(
        **head._asdict(), object="chat.completion.chunk", choices=[choice], usage=usage
    )


def chat_usage_chunk(head: Head, usage: Usage) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        **head._asdict(), object="chat.completion.chunk", choices=[], usage=usage
    )


def text_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: CompletionLogprobs | None = None,
    prompt_logprobs: PromptLogprobs | None = None,
) -> TextChoice:
    return TextChoice(
        index=index,
        text=text,
        logprobs=logprobs,
        finish_reason=finish_reason,
        prompt_logprobs=prompt_logprobs,
    )


def text_completion(
    head: Head, choices: list[TextChoice], usage: Usage | None = None
) -> TextCompletion:
    """The whole completion (with usage), or a stream chunk (one choice, finish_reason None
    until its end; usage so far when asked for)."""
    return TextCompletion(**head._asdict(), object="text_completion", choices=choices, usage=usage)


def text_usage_chunk(head: Head, usage: Usage) -> TextCompletion:
    return TextCompletion(**head._asdict(), object="text_completion", choices=[], usage=usage)


def chat_logprobs(
    entries: Sequence[TokenLogprob], token_bytes: Callable[[int], bytes]
) -> ChatLogprobs:
    """OpenAI chat logprobs; `token_bytes` gives the raw bytes of one token id."""

    def top(token_id: int, logprob: float) -> TopLogprobEntry:
        raw = token_bytes(token_id)
        return TopLogprobEntry(token=_text(raw), logprob=_finite(logprob), bytes=list(raw))

    content = []
    for entry in entries:
        chosen = top(entry.token_id, entry.logprob)
        content.append(
            TokenLogprobEntry(
                token=chosen.token,
                logprob=chosen.logprob,
                bytes=chosen.bytes,
                top_logprobs=[top(t.token_id, t.logprob) for t in entry.top],
            )
        )
    return ChatLogprobs(content)


def completion_logprobs(
    entries: Sequence[TokenLogprob],
    token_bytes: Callable[[int], bytes],
    text_offset: int = 0,
    *,
    first_token: int | None = None,
    top_n: int | None = None,
) -> CompletionLogprobs:
    """Legacy completions logprobs, `top_n` alternatives at most each; offsets count
    characters from `text_offset`. `first_token` comes first, with no logprob (the first
    token of an echoed prompt)."""
    ids = ([] if first_token is None else [first_token]) + [e.token_id for e in entries]
    tokens = [_text(token_bytes(t)) for t in ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    head: list[None] = [] if first_token is None else [None]
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[*head, *(_finite(e.logprob) for e in entries)],
        top_logprobs=[
            *head,
            *(
                {_text(token_bytes(t.token_id)): _finite(t.logprob) for t in e.top[:top_n]}
                for e in entries
            ),
        ],
        text_offset=offsets,
    )


def prompt_logprobs(
    entries: Sequence[TokenLogprob], token_bytes: Callable[[int], bytes], top_n: int
) -> PromptLogprobs:
    """vLLM's prompt_logprobs: None for the first prompt token, then for each next one its
    entry and its `top_n` best alternatives' (rank 1 = the best)."""
    out: PromptLogprobs = [None]

    def entry(token_id: int, logprob: float, rank: int) -> PromptLogprob:
        return PromptLogprob(
            logprob=_finite(logprob), rank=rank, decoded_token=_text(token_bytes(token_id))
        )

    for e in entries:
        ranked = {str(e.token_id): entry(e.token_id, e.logprob, e.rank)}
        for j, t in enumerate(e.top[:top_n], start=1):
            ranked.setdefault(str(t.token_id), entry(t.token_id, t.logprob, j))
        out.append(ranked)
    return out


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)  # also maps -inf; NaN never comes from log_softmax


def embedding_list(
    model: str, vectors: Sequence[Sequence[float]], encoding_format: str | None, num_tokens: int
) -> EmbeddingList:
    """One embedding per input, in order; "base64" packs little-endian float32 like OpenAI."""
    data = [
        EmbeddingData(
            embedding=_base64(v) if encoding_format == "base64" else list(v),
            index=i,
        )
        for i, v in enumerate(vectors)
    ]
    return EmbeddingList(
        data=data,
        model=model,
        usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )


def _base64(vector: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def model_list(entries: Sequence[ModelEntry]) -> ModelList:
    return ModelList(data=list(entries))

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


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


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
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]  # character offset of each token in the returned text


class FunctionCallDoc(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text


class ToolCallDoc(msgspec.Struct, kw_only=True):
    id: str
    type: str
    function: FunctionCallDoc


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | None  # null when the reply is tool calls only
    tool_calls: list[ToolCallDoc] | None = None  # left out when there are none


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaFunction(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One call's part in a chunk: id, type and name once, then argument fragments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction | None = None


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


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


class TextChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


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


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelEntry]


class TokenizeResponse(msgspec.Struct, kw_only=True):
    tokens: list[int]
    count: int
    max_model_len: int


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> Usage:
    details = None if cached_tokens is None else PromptTokensDetails(cached_tokens)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=details,
    )


def chat_completion(
    head: Head,
    content: str | None,
    finish_reason: str,
    usage: Usage,
    logprobs: ChatLogprobs | None = None,
    tool_calls: list[ToolCallDoc] | None = None,
) -> ChatCompletion:
    message = AssistantMessage(role="assistant", content=content, tool_calls=tool_calls)
    choice = ChatChoice(index=0, message=message, logprobs=logprobs, finish_reason=finish_reason)
    return ChatCompletion(**head._asdict(), object="chat.completion", choices=[choice], usage=usage)


def chat_role_chunk(head: Head) -> ChatCompletionChunk:
    """The first chunk of a chat stream: the assistant role and empty content."""
    choice = ChunkChoice(index=0, delta=Delta(role="assistant", content=""))
    return ChatCompletionChunk(**head._asdict(), object="chat.completion.chunk", choices=[choice])


def chat_chunk(
    head: Head,
    content: str | None,
    finish_reason: str | None = None,
    logprobs: ChatLogprobs | None = None,
    tool_calls: list[DeltaToolCall] | None = None,
) -> ChatCompletionChunk:
    """A content (and tool-call) delta; nothing gives `delta: {}` (a finish, nothing left)."""
    delta = Delta(content=content, tool_calls=tool_calls)
    choice = ChunkChoice(index=0, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
    return ChatCompletionChunk(**head._asdict(), object="chat.completion.chunk", choices=[choice])


def chat_usage_chunk(head: Head, usage: Usage) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        **head._asdict(), object="chat.completion.chunk", choices=[], usage=usage
    )


def text_completion(
    head: Head,
    text: str,
    finish_reason: str | None,
    usage: Usage | None = None,
    logprobs: CompletionLogprobs | None = None,
) -> TextCompletion:
    """The whole completion (with usage), or a stream chunk (finish_reason None until the end)."""
    choice = TextChoice(index=0, text=text, logprobs=logprobs, finish_reason=finish_reason)
    return TextCompletion(**head._asdict(), object="text_completion", choices=[choice], usage=usage)


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
    entries: Sequence[TokenLogprob], token_bytes: Callable[[int], bytes], text_offset: int = 0
) -> CompletionLogprobs:
    """Legacy completions logprobs; offsets count characters from `text_offset`."""
    tokens = [_text(token_bytes(e.token_id)) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[_finite(e.logprob) for e in entries],
        top_logprobs=[
            {_text(token_bytes(t.token_id)): _finite(t.logprob) for t in e.top} for e in entries
        ],
        text_offset=offsets,
    )


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

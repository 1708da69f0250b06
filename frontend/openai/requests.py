"""OpenAI request bodies as msgspec Structs, and their decoding into typed 400 errors.

Unknown fields are ignored. A field the client leaves out or sends as null is None here;
defaults are applied by `frontend.openai.conversion`. Error params name the field by its JSON
path without the leading `$.`: `temperature`, `messages[0].content`, `stop[1]`.
"""

from __future__ import annotations

import logging
import re
from types import MappingProxyType
from typing import Any, Final, TypeVar

import msgspec

from shared.errors import ErrorCode, ServingError

log = logging.getLogger(__name__)


class TextPart(msgspec.Struct, kw_only=True):
    """One element of an array `content`; only type "text" is served."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM: usage so far in every chunk


class SamplingFields(msgspec.Struct, kw_only=True):
    """vLLM's extras, shared by both generation requests."""

    min_tokens: int | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    priority: int | None = None  # vLLM's: lower runs first
    cache_salt: str | None = None
    prompt_logprobs: int | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/chat/completions."""

    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    echo: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: Any = None
    user: str | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, float] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/completions; `prompt` is one or several prompts (texts, or token ids)."""

    model: str
    # str | list[str] | list[int] | list[list[int]]; msgspec allows one array type per union.
    prompt: str | list[str | int | list[int]]
    suffix: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None
    best_of: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: int | None = None
    echo: bool | None = None
    user: str | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, float] | None = None


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """POST /v1/embeddings."""

    model: str
    input: str | list[str | int | list[int]]
    encoding_format: str | None = None  # "float" (default) or "base64"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /v1/tokenize: a prompt, or messages rendered through the chat template."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /detokenize: token ids back to text."""

    model: str
    tokens: list[int]


Request = (
    ChatCompletionRequest
    | CompletionRequest
    | EmbeddingRequest
    | TokenizeRequest
    | DetokenizeRequest
)
GenerateRequest = ChatCompletionRequest | CompletionRequest
R = TypeVar(
    "R",
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    DetokenizeRequest,
)
KINDS: Final = (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    DetokenizeRequest,
)

# Decoders are immutable and costly to build: one per request type.
_DECODERS: Final = MappingProxyType({kind: msgspec.json.Decoder(kind) for kind in KINDS})
_KEYS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])  # the top-level fields of a body
# The body field that must be present (and non-null) for each kind, besides `model`.
_REQUIRED: Final = MappingProxyType(
    {
        ChatCompletionRequest: ("model", "messages"),
        CompletionRequest: ("model", "prompt"),
        EmbeddingRequest: ("model", "input"),
        TokenizeRequest: ("model",),
        DetokenizeRequest: ("model", "tokens"),
    }
)
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")


def decode_request(body: bytes, kind: type[R]) -> R:
    """Decode a JSON body into `kind`; raise ServingError (400) on any schema problem."""
    try:
        request = _DECODERS[kind].decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc), _REQUIRED[kind]) from None
    except msgspec.DecodeError as exc:
        raise ServingError(
            ErrorCode.INVALID_JSON, f"We could not parse the JSON body of your request: {exc}"
        ) from None
    assert isinstance(request, kind)
    if isinstance(request, ChatCompletionRequest) and not request.messages:
        raise ServingError(
            ErrorCode.MISSING_REQUIRED_PARAMETER, "'messages' must not be empty.", "messages"
        )
    return request


class RequestDecoder:
    """decode_request, and a warning the first time each unknown top-level field is seen
    (unknown fields are ignored: a client may be written for another server)."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def decode(self, body: bytes, kind: type[R]) -> R:
        request = decode_request(body, kind)
        unknown = _KEYS.decode(body).keys() - kind.__struct_fields__ - self._warned
        for name in sorted(unknown):
            log.warning("ignored the unknown field %r of a %s (warned once)", name, kind.__name__)
        self._warned |= unknown
        return request


def _validation_error(text: str, required: tuple[str, ...]) -> ServingError:
    match = _AT.match(text)
    assert match is not None  # the pattern matches any string
    what, path = match["what"], _param(match["path"] or "")
    missing = _MISSING.match(what)
    if missing is not None:
        param = f"{path}.{missing['field']}" if path else missing["field"]
        return ServingError(
            ErrorCode.MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{param}'.", param
        )
    if path in required and what.endswith("got `null`"):
        return ServingError(
            ErrorCode.MISSING_REQUIRED_PARAMETER, f"Missing required parameter: '{path}'.", path
        )
    if not path:
        return ServingError(ErrorCode.INVALID_VALUE, f"Invalid request body: {what}.")
    return ServingError(ErrorCode.INVALID_VALUE, f"Invalid value for '{path}': {what}.", path)


def _param(path: str) -> str:
    """`.messages[0][...]` -> `messages[0]`: the JSON path without `$.` or dict-key markers."""
    return path.replace("[...]", "").removeprefix(".")

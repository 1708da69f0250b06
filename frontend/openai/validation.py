"""Checks on decoded OpenAI requests: ranges, unsupported fields, prompts and inputs.

Every check raises ServingError: 400 invalid_value for a value out of range, 422
unsupported_parameter for something OpenAI serves and this server does not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from frontend.openai.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    EmbeddingRequest,
    GenerateRequest,
    TokenizeRequest,
)
from shared.errors import ErrorCode, ServingError
from shared.protocol import MAX_CHOICES

ROLES: Final = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_STOP: Final = 4
MAX_LOGPROBS: Final = 20
MAX_PROMPTS: Final = 256  # prompts of one /v1/completions request
MAX_LOGIT_BIAS: Final = 100.0
# what the chat template is always given; chat_template_kwargs may add, not replace
TEMPLATE_ARGUMENTS: Final = frozenset({"messages", "add_generation_prompt", "tools"})
PRIORITY_HEADER: Final = "X-TL-Priority"
_INTEGER: Final = re.compile(r"\s*[+-]?[0-9]{1,9}\s*")


def invalid(param: str | None, message: str) -> ServingError:
    return ServingError(ErrorCode.INVALID_VALUE, message, param)


def unsupported(param: str, message: str) -> ServingError:
    return ServingError(ErrorCode.UNSUPPORTED_PARAMETER, message, param)


def validate_chat(req: ChatCompletionRequest, max_stop: int = MAX_STOP) -> None:
    _validate_sampling(req, max_stop)
    for name, value in (
        ("max_tokens", req.max_tokens),
        ("max_completion_tokens", req.max_completion_tokens),
    ):
        if value is not None and value < 1:
            raise invalid(name, f"'{name}' must be at least 1, got {value}.")
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise invalid("top_logprobs", f"'top_logprobs' must be in [0, {MAX_LOGPROBS}].")
        if not req.logprobs:
            raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
    if req.echo:
        raise unsupported("echo", "'echo' is served on /v1/completions only.")
    check_template_kwargs(req.chat_template_kwargs)
    for name, given in (
        ("tools", req.tools),
        ("tool_choice", req.tool_choice),
        ("response_format", req.response_format),
    ):
        if given is not None:
            raise unsupported(name, f"'{name}' is not supported yet.")
    _validate_messages(req.messages)


def validate_completion(req: CompletionRequest, max_stop: int = MAX_STOP) -> None:
    _validate_sampling(req, max_stop)
    least = 0 if req.echo else 1  # with echo, 0 scores the prompt only
    if req.max_tokens is not None and req.max_tokens < least:
        raise invalid("max_tokens", f"'max_tokens' must be at least {least}, got {req.max_tokens}.")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise invalid("logprobs", f"'logprobs' must be in [0, {MAX_LOGPROBS}].")
    if req.best_of is not None and req.best_of < 1:
        raise invalid("best_of", "'best_of' must be at least 1.")
    if req.best_of is not None and req.best_of > 1:
        raise unsupported("best_of", "'best_of' > 1 is not supported.")
    if req.suffix:
        raise unsupported("suffix", "'suffix' is not supported.")
    completion_prompts(req)


def validate_embedding(req: EmbeddingRequest) -> None:
    if req.encoding_format not in (None, "float", "base64"):
        raise invalid("encoding_format", "'encoding_format' must be 'float' or 'base64'.")
    if req.dimensions is not None:
        raise unsupported("dimensions", "'dimensions' is not supported.")
    embedding_inputs(req)


def validate_tokenize(req: TokenizeRequest) -> None:
    if req.prompt is None and req.messages is None:
        raise ServingError(
            ErrorCode.MISSING_REQUIRED_PARAMETER, "Give 'prompt' or 'messages'.", "prompt"
        )
    if req.prompt is not None and req.messages is not None:
        raise invalid("messages", "Give 'prompt' or 'messages', not both.")
    if req.messages is not None:
        if not req.messages:
            raise ServingError(
                ErrorCode.MISSING_REQUIRED_PARAMETER, "'messages' must not be empty.", "messages"
            )
        _validate_messages(req.messages)
    check_template_kwargs(req.chat_template_kwargs)


def check_template_kwargs(kwargs: dict[str, object] | None) -> None:
    clash = sorted(TEMPLATE_ARGUMENTS & set(kwargs or ()))
    if clash:
        raise invalid("chat_template_kwargs", f"'chat_template_kwargs' may not set {clash[0]!r}.")


def _validate_sampling(req: GenerateRequest, max_stop: int) -> None:
    _check_range("temperature", req.temperature, 0.0, 2.0)
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise invalid("top_p", f"'top_p' must be in (0, 1], got {req.top_p}.")
    if req.top_k is not None and req.top_k < -1:
        raise invalid("top_k", "'top_k' must be -1 or 0 (off), or a positive number.")
    _check_range("min_p", req.min_p, 0.0, 1.0)
    _check_range("presence_penalty", req.presence_penalty, -2.0, 2.0)
    _check_range("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    if req.repetition_penalty is not None and not req.repetition_penalty > 0.0:
        raise invalid("repetition_penalty", "'repetition_penalty' must be positive.")
    if req.n is not None and not 1 <= req.n <= MAX_CHOICES:
        raise invalid("n", f"'n' must be in [1, {MAX_CHOICES}], got {req.n}.")
    if isinstance(req.stop, list) and len(req.stop) > max_stop:
        raise invalid("stop", f"At most {max_stop} stop sequences are allowed.")
    if req.stop_token_ids is not None and any(i < 0 for i in req.stop_token_ids):
        raise invalid("stop_token_ids", "'stop_token_ids' must be token ids.")
    logit_bias(req)
    if req.min_tokens is not None and req.min_tokens < 0:
        raise invalid("min_tokens", "'min_tokens' must be at least 0.")
    if req.priority is not None and not -100 <= req.priority <= 100:
        raise invalid("priority", "'priority' must be in [-100, 100].")
    if req.cache_salt is not None and not req.cache_salt:
        raise invalid("cache_salt", "'cache_salt' must be a non-empty string.")
    if req.prompt_logprobs is not None:
        if not 0 <= req.prompt_logprobs <= MAX_LOGPROBS:
            raise invalid("prompt_logprobs", f"'prompt_logprobs' must be in [0, {MAX_LOGPROBS}].")
        if req.stream:
            raise invalid("prompt_logprobs", "'prompt_logprobs' is not served on streams.")


def logit_bias(req: GenerateRequest) -> dict[int, float]:
    """The token id -> bias map of a request (OpenAI: ids as strings, biases in [-100, 100])."""
    out: dict[int, float] = {}
    for key, bias in (req.logit_bias or {}).items():
        if not key.isascii() or not key.isdigit() or len(key) > 9:
            raise invalid("logit_bias", f"'logit_bias' keys must be token ids, got {key!r}.")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise invalid("logit_bias", "'logit_bias' values must be in [-100, 100].")
        out[int(key)] = bias
    return out


def _check_range(name: str, value: float | None, lo: float, hi: float) -> None:
    if value is not None and not lo <= value <= hi:
        raise invalid(name, f"'{name}' must be in [{lo:g}, {hi:g}], got {value}.")


def _validate_messages(messages: list[ChatMessage]) -> None:
    for i, message in enumerate(messages):
        if message.role not in ROLES:
            raise invalid(f"messages[{i}].role", f"Unknown role '{message.role}'.")
        if message.content is None:
            if message.role != "assistant":
                raise ServingError(
                    ErrorCode.MISSING_REQUIRED_PARAMETER,
                    f"'messages[{i}].content' is required.",
                    f"messages[{i}].content",
                )
            continue
        if isinstance(message.content, str):
            continue
        for j, part in enumerate(message.content):
            if part.type != "text":
                raise unsupported(
                    f"messages[{i}].content",
                    f"Content parts of type '{part.type}' are not supported.",
                )
            if part.text is None:
                raise ServingError(
                    ErrorCode.MISSING_REQUIRED_PARAMETER,
                    f"'messages[{i}].content[{j}].text' is required.",
                    f"messages[{i}].content[{j}].text",
                )


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completion request, in order: texts, or token-id lists."""
    return _texts_or_ids("prompt", req.prompt, MAX_PROMPTS)


def embedding_inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """The inputs of an embedding request, in order: texts or token-id lists."""
    return _texts_or_ids("input", req.input, None)


def _texts_or_ids(
    param: str, given: str | list[str | int | list[int]], max_items: int | None
) -> list[str | list[int]]:
    """One text or token-id list, or a list of them (not mixed)."""
    items = [given] if isinstance(given, str) else given
    if not items:
        raise invalid(param, f"'{param}' must not be empty.")
    if all(isinstance(x, int) for x in items):
        return [checked_token_ids(param, items)]
    if max_items is not None and len(items) > max_items:
        raise invalid(param, f"At most {max_items} items are allowed in '{param}'.")
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        where = param if isinstance(given, str) else f"{param}[{i}]"
        if isinstance(item, int) or type(item) is not type(items[0]):
            raise invalid(param, f"'{param}' mixes texts and token ids.")
        if not item:
            raise invalid(where, f"'{where}' must not be empty.")
        out.append(item if isinstance(item, str) else checked_token_ids(where, item))
    return out


def checked_token_ids(param: str, ids: Sequence[object]) -> list[int]:
    checked = [i for i in ids if isinstance(i, int) and i >= 0]
    if not checked or len(checked) != len(ids):
        raise invalid(param, f"'{param}' must hold non-negative token ids.")
    return checked


def parse_priority(value: str | None) -> int:
    """The X-TL-Priority header: an integer in [-100, 100], default 0."""
    if value is None:
        return 0
    if _INTEGER.fullmatch(value) is None:
        raise invalid(PRIORITY_HEADER, f"{PRIORITY_HEADER} must be an integer.")
    priority = int(value)
    if not -100 <= priority <= 100:
        raise invalid(PRIORITY_HEADER, f"{PRIORITY_HEADER} must be in [-100, 100].")
    return priority


def check_num_messages(num: int, max_messages: int | None) -> None:
    """max_messages (runtime.toml) bounds the work one request can ask of the template."""
    if max_messages is not None and num > max_messages:
        raise invalid("messages", f"At most {max_messages} messages are allowed, got {num}.")

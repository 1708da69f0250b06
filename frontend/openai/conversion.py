"""The one conversion of a decoded OpenAI request into what the core is asked for: a
GenerationJob (prompt ids, sampling params, stop strings, stream options), or token ids."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from frontend.openai.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    GenerateRequest,
    TokenizeRequest,
)
from frontend.openai.validation import (
    PRIORITY_HEADER,
    check_num_messages,
    checked_token_ids,
    completion_prompts,
    embedding_inputs,
    invalid,
    logit_bias,
    parse_priority,
    validate_chat,
    validate_completion,
    validate_embedding,
    validate_tokenize,
)
from frontend.text.chat_template import TemplateRenderError
from frontend.text.served_model import ServedModel
from shared.eos import stop_token_ids
from shared.errors import ErrorCode, ServingError
from shared.protocol import SamplingParams, Welcome

# Above any vocabulary: a larger top_k means "off", a larger stop id can never be sampled. Both
# are cut to this so the Submit always encodes (msgspec refuses ints beyond 64 bits).
MAX_TOKEN_ID: Final = 2**31 - 1
DEFAULT_COMPLETION_MAX_TOKENS: Final = 16
KV_HANDLE_HEADER: Final = "X-TL-KV-Handle"


class Prompt(NamedTuple):
    """One prompt of a job: its token ids, and the text `echo` writes back."""

    ids: list[int]
    text: str


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """One validated generation request: what the core is sent, and how its answer is written."""

    chat: bool  # chat.completion documents, else text_completion
    prompts: list[Prompt]  # one Submit each; choice p * n + j is choice j of prompt p
    n: int  # choices per prompt
    params: SamplingParams
    stops: list[str]  # stop strings: the frontend cuts the text there
    priority: int
    cache_salt: str
    stream: bool
    include_usage: bool  # streamed: a usage chunk before [DONE]
    continuous_usage: bool  # streamed: usage so far in every chunk
    echo: bool  # each choice's text starts with its prompt
    include_stop: bool  # a stop string (or stop token) that ends a choice stays in its text
    skip_special_tokens: bool
    prompt_logprobs: int | None  # vLLM's prompt_logprobs field: top n per prompt token
    param: str  # the field a context refusal names: messages or prompt

    @property
    def logprobs(self) -> int | None:
        """Top alternatives per token of the answer's logprobs; None = no logprobs."""
        return self.params.logprobs

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n


class Converter:
    """Decoded OpenAI requests -> work for the core; every refusal is a ServingError.

    The checks run in one order for every route: the document, then the model and the headers,
    then a core to send to (503 if none), then the prompt (template, tokens, context).
    """

    def __init__(
        self,
        model: ServedModel,
        require_welcome: Callable[[], Welcome],
        *,
        max_messages: int | None = None,
        max_embedding_inputs: int | None = None,
        max_embedding_tokens: int | None = None,
    ) -> None:
        self._model = model
        self._require_welcome = require_welcome  # the core's Welcome, or 503 engine_unavailable
        self._max_messages = max_messages
        self._max_embedding_inputs = max_embedding_inputs
        self._max_embedding_tokens = max_embedding_tokens  # all inputs of one request together

    async def chat(self, req: ChatCompletionRequest, headers: Mapping[str, str]) -> GenerationJob:
        validate_chat(req)
        check_num_messages(len(req.messages), self._max_messages)
        welcome, priority = self._gate(req.model, headers, req.priority)
        text = self._render(req.messages, True, req.chat_template_kwargs)
        # the template writes the special tokens it wants: none are added
        prompt_ids = await self._model.encode(text, add_special_tokens=False)
        return _job(req, [Prompt(prompt_ids, text)], welcome, priority)

    async def completion(self, req: CompletionRequest, headers: Mapping[str, str]) -> GenerationJob:
        validate_completion(req)
        welcome, priority = self._gate(req.model, headers, req.priority)
        prompts = []
        for i, prompt in enumerate(completion_prompts(req)):
            if isinstance(prompt, str):
                ids = await self._model.encode(prompt, add_special_tokens=True)
                prompts.append(Prompt(ids, prompt))
            else:
                param = "prompt" if len(prompts) == i == 0 else f"prompt[{i}]"
                ids = _in_vocabulary(param, prompt, welcome)
                prompts.append(Prompt(ids, self._model.decode_special(ids)))
        return _job(req, prompts, welcome, priority)

    async def embeddings(self, req: EmbeddingRequest) -> list[list[int]]:
        """The token ids of each input, in order."""
        validate_embedding(req)
        self._model.check(req.model)
        welcome = self._require_welcome()
        items = embedding_inputs(req)
        if self._max_embedding_inputs is not None and len(items) > self._max_embedding_inputs:
            raise invalid(
                "input", f"'input' has {len(items)} inputs; at most {self._max_embedding_inputs}."
            )
        inputs: list[list[int]] = []
        num_tokens = 0
        for i, item in enumerate(items):
            param = "input" if isinstance(req.input, str) else f"input[{i}]"
            ids = (
                await self._model.encode(item, add_special_tokens=True)
                if isinstance(item, str)
                else item
            )
            if not ids:
                raise invalid(param, f"'{param}' has no tokens.")
            if len(ids) > welcome.max_model_len:
                raise ServingError(
                    ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                    f"This model's maximum context length is {welcome.max_model_len} tokens; "
                    f"'{param}' has {len(ids)}.",
                    param,
                )
            inputs.append(_in_vocabulary(param, ids, welcome))
            num_tokens += len(ids)
            if self._max_embedding_tokens is not None and num_tokens > self._max_embedding_tokens:
                raise invalid(
                    "input",
                    f"'input' has more than {self._max_embedding_tokens} tokens in all.",
                )
        return inputs

    async def tokenize(self, req: TokenizeRequest) -> tuple[list[int], Welcome]:
        """The token ids of the prompt, or of the messages as the chat template renders them."""
        validate_tokenize(req)
        self._model.check(req.model)
        welcome = self._require_welcome()
        if req.messages is not None:
            check_num_messages(len(req.messages), self._max_messages)
            text = self._render(
                req.messages, req.add_generation_prompt is not False, req.chat_template_kwargs
            )
            # what /v1/chat/completions would send: the template wrote its special tokens
            add_special_tokens = bool(req.add_special_tokens)
        else:
            assert req.prompt is not None  # validate_tokenize
            text = req.prompt
            add_special_tokens = req.add_special_tokens is not False
        return await self._model.encode(text, add_special_tokens), welcome

    def token_strs(self, tokens: list[int]) -> list[str]:
        """Each token's vocabulary entry (byte-level BPE writes a leading space as "Ġ")."""
        return [self._model.tokenizer.id_to_token(t) or "" for t in tokens]

    def detokenize(self, req: DetokenizeRequest) -> str:
        """The text of the token ids, special tokens written out."""
        self._model.check(req.model)
        welcome = self._require_welcome()
        if req.tokens:
            _in_vocabulary("tokens", checked_token_ids("tokens", req.tokens), welcome)
        return self._model.decode_special(req.tokens)

    def _gate(
        self, model: str, headers: Mapping[str, str], body_priority: int | None = None
    ) -> tuple[Welcome, int]:
        """Model, priority, KV handle, a core to send to: checked before any prompt work.

        X-TL-Priority (higher first) wins over the body's vLLM `priority` (lower first).
        """
        self._model.check(model)
        header = headers.get(PRIORITY_HEADER)
        priority = parse_priority(header) if header is not None else -(body_priority or 0)
        if KV_HANDLE_HEADER in headers:
            raise ServingError(
                ErrorCode.KV_HANDLE_NOT_FOUND,
                "No KV cache is held under this handle (disaggregation is not served).",
                KV_HANDLE_HEADER,
            )
        return self._require_welcome(), priority

    def _render(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None,
    ) -> str:
        template = self._model.template
        # a template that knows no developer role reads such messages as system ones
        keep_developer = "developer" in template.source
        try:
            return template.render(
                template_messages(messages, keep_developer),
                add_generation_prompt=add_generation_prompt,
                variables=template_kwargs,
            )
        except TemplateRenderError as e:
            raise invalid("messages", e.message) from e


def _job(
    req: GenerateRequest, prompts: list[Prompt], welcome: Welcome, priority: int
) -> GenerationJob:
    chat = isinstance(req, ChatCompletionRequest)
    param = "messages" if chat else "prompt"
    requested = requested_max_tokens(req)
    if not all(prompt.ids for prompt in prompts):
        raise invalid(param, f"The {param} must not render to an empty prompt.")
    # as asked (every prompt has room for it), or what the context leaves
    max_tokens = min(
        context_budget(requested, len(prompt.ids), welcome.max_model_len, param)
        for prompt in prompts
    )
    if req.min_tokens is not None and req.min_tokens > max_tokens:
        raise invalid("min_tokens", f"'min_tokens' must be at most max_tokens ({max_tokens}).")
    bias = logit_bias(req)
    if any(t >= welcome.vocab_size for t in bias):
        raise invalid("logit_bias", f"'logit_bias' token ids must be below {welcome.vocab_size}.")
    options = req.stream_options
    stream = bool(req.stream)
    echo = isinstance(req, CompletionRequest) and bool(req.echo)
    return GenerationJob(
        chat=chat,
        prompts=prompts,
        n=req.n or 1,
        params=to_sampling_params(req, max_tokens, welcome.eos_ids, bias),
        stops=stop_strings(req),
        priority=priority,
        cache_salt=req.cache_salt or "",
        stream=stream,
        include_usage=bool(options is not None and options.include_usage),
        continuous_usage=bool(options is not None and options.continuous_usage_stats),
        echo=echo,
        include_stop=bool(req.include_stop_str_in_output),
        skip_special_tokens=req.skip_special_tokens is not False,
        prompt_logprobs=req.prompt_logprobs,
        param=param,
    )


def _in_vocabulary(param: str, ids: list[int], welcome: Welcome) -> list[int]:
    if max(ids) >= welcome.vocab_size:
        raise invalid(param, f"Token ids must be below {welcome.vocab_size}.")
    return ids


def context_budget(requested: int | None, num_prompt: int, max_model_len: int, param: str) -> int:
    """max_tokens for the core: as asked, or what is left of the context (400 if nothing fits).

    A request may ask for 0 (echo: the prompt is scored, nothing generated)."""
    max_tokens = max_model_len - num_prompt if requested is None else requested
    if max_tokens < (1 if requested is None else 0) or num_prompt + max_tokens > max_model_len:
        raise ServingError(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max(max_tokens, 0)} tokens ({num_prompt} in the {param}, "
            f"{max(max_tokens, 0)} in the completion). Please reduce the length of the {param} "
            "or of the completion.",
            param,
        )
    return max_tokens


def template_messages(
    messages: list[ChatMessage], keep_developer: bool = True
) -> list[dict[str, str]]:
    """Validated messages as the chat template sees them: text parts joined by newlines, a
    `name` kept, `developer` as `system` unless the template knows it."""
    rendered = []
    for message in messages:
        if message.content is None:
            content = ""
        elif isinstance(message.content, str):
            content = message.content
        else:
            content = "\n".join(part.text or "" for part in message.content)
        role = message.role
        if role == "developer" and not keep_developer:
            role = "system"
        entry = {"role": role, "content": content}
        if message.name is not None:
            entry["name"] = message.name
        rendered.append(entry)
    return rendered


def stop_strings(req: GenerateRequest) -> list[str]:
    if req.stop is None:
        return []
    stops = [req.stop] if isinstance(req.stop, str) else req.stop
    return [s for s in stops if s]


def requested_max_tokens(req: GenerateRequest) -> int | None:
    """The client's token limit; None (chat only) means what is left of the context."""
    if isinstance(req, CompletionRequest):
        return DEFAULT_COMPLETION_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def to_sampling_params(
    req: GenerateRequest,
    max_tokens: int,
    eos_ids: Iterable[int],
    bias: dict[int, float] | None = None,
) -> SamplingParams:
    """Translate a validated request; `max_tokens` is already resolved against the context,
    `bias` is its checked logit_bias."""
    prompt_logprobs = req.prompt_logprobs
    if isinstance(req, ChatCompletionRequest):
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        logprobs = req.logprobs
        if req.echo and logprobs is not None:  # the echoed prompt's tokens have logprobs too
            prompt_logprobs = max(logprobs, prompt_logprobs or 0)
    ignore_eos = bool(req.ignore_eos)
    own = (i for i in req.stop_token_ids or () if i <= MAX_TOKEN_ID)
    top_k = min(req.top_k, MAX_TOKEN_ID) if req.top_k is not None and req.top_k > 0 else 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=top_k,
        min_p=req.min_p or 0.0,
        # Any integer seeds; the core sees it as an unsigned 64-bit number.
        seed=None if req.seed is None else req.seed % (1 << 64),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        stop_token_ids=stop_token_ids(eos_ids, own, ignore_eos),
        ignore_eos=ignore_eos,
        logprobs=logprobs,
        min_tokens=req.min_tokens or 0,
        logit_bias=bias or {},
        prompt_logprobs=prompt_logprobs,
    )

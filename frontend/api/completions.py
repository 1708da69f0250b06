"""POST /v1/chat/completions and /v1/completions: prompt -> core -> text, streamed or whole."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.api.metrics import Metrics, RequestTimer
from frontend.api.sse import SSEStream
from frontend.core.client import CoreClient
from frontend.core.stream import RequestStream
from frontend.openai import responses as docs
from frontend.openai.formats import ChatFormat, Format, TextFormat
from frontend.openai.requests import ChatCompletionRequest, CompletionRequest, decode_request
from frontend.openai.validation import (
    PRIORITY_HEADER,
    GenerateRequest,
    check_num_messages,
    completion_prompt,
    invalid,
    parse_priority,
    requested_max_tokens,
    stop_strings,
    template_messages,
    to_sampling_params,
    validate_chat,
    validate_completion,
)
from frontend.text.chat_template import TemplateRenderError
from frontend.text.generation import Generation, Piece
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError
from shared.protocol import TokenEvent, TokenLogprob, Welcome

log = logging.getLogger(__name__)

KV_HANDLE_HEADER: Final = "X-TL-KV-Handle"
PING_INTERVAL_S: Final = 15.0


def context_budget(requested: int | None, num_prompt: int, max_model_len: int, param: str) -> int:
    """max_tokens for the core: as asked, or what is left of the context (400 if nothing fits)."""
    max_tokens = max_model_len - num_prompt if requested is None else requested
    if max_tokens < 1 or num_prompt + max_tokens > max_model_len:
        raise ServingError(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max(max_tokens, 0)} tokens ({num_prompt} in the {param}, "
            f"{max(max_tokens, 0)} in the completion). Please reduce the length of the {param} "
            "or of the completion.",
            param,
        )
    return max_tokens


class GenerateRoutes:
    """The two generation endpoints; everything but the prompt is shared."""

    def __init__(
        self,
        core: CoreClient,
        model: ServedModel,
        metrics: Metrics,
        *,
        ping_interval_s: float = PING_INTERVAL_S,
        max_messages: int | None = None,
    ) -> None:
        self._core = core
        self._model = model
        self._metrics = metrics
        self._ping_interval_s = ping_interval_s
        self._max_messages = max_messages

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = decode_request(await request.read(), ChatCompletionRequest)
        validate_chat(req)
        check_num_messages(len(req.messages), self._max_messages)
        welcome, priority = self._gate(request, req.model)
        try:
            text = self._model.template.render(
                template_messages(req.messages), add_generation_prompt=True
            )
        except TemplateRenderError as e:
            raise invalid("messages", e.message) from e
        # the template writes the special tokens it wants: none are added
        prompt_ids = await self._model.encode(text, add_special_tokens=False)
        return await self._generate(request, req, prompt_ids, welcome, priority, arrival)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = decode_request(await request.read(), CompletionRequest)
        validate_completion(req)
        welcome, priority = self._gate(request, req.model)
        prompt = completion_prompt(req)
        if isinstance(prompt, str):
            prompt_ids = await self._model.encode(prompt, add_special_tokens=True)
        elif max(prompt) >= welcome.vocab_size:
            raise invalid("prompt", f"Token ids must be below {welcome.vocab_size}.")
        else:
            prompt_ids = prompt
        return await self._generate(request, req, prompt_ids, welcome, priority, arrival)

    def _gate(self, request: web.Request, model: str) -> tuple[Welcome, int]:
        """Model, priority, KV handle, a core to send to: checked before any prompt work."""
        self._model.check(model)
        priority = parse_priority(request.headers.get(PRIORITY_HEADER))
        if KV_HANDLE_HEADER in request.headers:
            raise ServingError(
                ErrorCode.KV_HANDLE_NOT_FOUND,
                "No KV cache is held under this handle (disaggregation is not served).",
                KV_HANDLE_HEADER,
            )
        return self._core.require_welcome(), priority

    async def _generate(
        self,
        request: web.Request,
        req: GenerateRequest,
        prompt_ids: list[int],
        welcome: Welcome,
        priority: int,
        arrival: float,
    ) -> web.StreamResponse:
        chat = isinstance(req, ChatCompletionRequest)
        param = "messages" if chat else "prompt"
        if not prompt_ids:
            raise invalid(param, f"The {param} must not render to an empty prompt.")
        requested = requested_max_tokens(req)
        max_tokens = context_budget(requested, len(prompt_ids), welcome.max_model_len, param)
        params = to_sampling_params(req, max_tokens, welcome.eos_ids)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = docs.Head(id=rid, created=int(time.time()), model=self._model.model_id)
        kind = ChatFormat if chat else TextFormat
        job = _Job(
            generation=Generation(self._model.decode, prompt_ids, stop_strings(req)),
            fmt=kind(head, self._model.token_bytes, params.logprobs is not None),
            timer=RequestTimer(self._metrics, arrival),
            num_prompt=len(prompt_ids),
            param=param,
            stream=self._core.submit(
                rid, prompt_ids, params, priority
            ),  # last: nothing can fail after it
        )
        try:
            if req.stream:
                options = req.stream_options
                include_usage = bool(options is not None and options.include_usage)
                return await self._stream(request, job, include_usage)
            return await self._collect(job)
        finally:
            # a stop string, a client gone (a failed write, or aiohttp cancelling this task):
            # the core still generates until told; release() sends the Abort without awaiting
            self._core.release(job.stream)

    async def _collect(self, job: _Job) -> web.Response:
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        while job.generation.finish_reason is None:
            item = await job.stream.get()
            if isinstance(item, ServingError):
                raise job.refusal(item)
            assert item is not None  # no timeout
            piece = job.push(item)
            text.append(piece.text)
            logprobs += piece.logprobs
        job.timer.finish()
        document = job.fmt.whole("".join(text), job.generation.finish_reason, job.usage(), logprobs)
        return json_response(document)

    async def _stream(
        self, request: web.Request, job: _Job, include_usage: bool
    ) -> web.StreamResponse:
        # A refusal (429 full queue, 503) comes before any token: it must be a real HTTP
        # status, so the headers wait for the first event.
        item = await job.stream.get()
        if isinstance(item, ServingError):
            raise job.refusal(item)
        sse = await SSEStream.open(request)
        try:
            for document in job.fmt.opening():
                await sse.send(document)
            while True:
                if item is None:
                    await sse.ping()
                elif isinstance(item, ServingError):
                    await sse.error(item)
                    return sse.response
                else:
                    piece = job.push(item)
                    # finish_reason rides on the last text, or on a `delta: {}` of its own
                    if piece.text or piece.finish_reason is not None:
                        await sse.send(job.fmt.chunk(piece))
                    if piece.finish_reason is not None:
                        break
                item = await job.stream.get(self._ping_interval_s)
            job.timer.finish()
            if include_usage:
                await sse.send(job.fmt.usage_chunk(job.usage()))
            await sse.done()
        except ConnectionResetError:
            log.info("client went away during %s", job.stream.rid)
        return sse.response


@dataclass(slots=True)
class _Job:
    """One submitted generation request and the state its response is built from."""

    stream: RequestStream
    generation: Generation
    fmt: Format
    timer: RequestTimer
    num_prompt: int
    param: str  # the field a context refusal names: messages or prompt

    def push(self, event: TokenEvent) -> Piece:
        self.timer.tokens(len(event.token_ids))
        return self.generation.push(event)

    def usage(self) -> docs.Usage:
        cached = self.generation.num_cached_tokens or None
        return docs.usage(self.num_prompt, self.generation.num_tokens, cached)

    def refusal(self, error: ServingError) -> ServingError:
        """A context refusal from the core names no field; the request's prompt is the one."""
        if error.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED and error.param is None:
            error.param = self.param
        return error

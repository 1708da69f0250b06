"""POST /v1/chat/completions and /v1/completions: decode, convert, submit, stream (or collect)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.api.metrics import Metrics, RequestTimer
from frontend.api.middleware import REQUEST_ID
from frontend.api.sse import SSEStream
from frontend.core.client import CoreClient
from frontend.core.request_stream import RequestStream
from frontend.openai import responses as docs
from frontend.openai.conversion import Converter, GenerationJob, Prompt
from frontend.openai.formats import ChatFormat, ChoiceOutput, Format, TextFormat, TokenBytes
from frontend.openai.requests import ChatCompletionRequest, CompletionRequest, RequestDecoder
from frontend.text.generation import Generation, Piece
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError
from shared.protocol import Submit, TokenEvent, TokenLogprob

log = logging.getLogger(__name__)

PING_INTERVAL_S: Final = 15.0
_STREAM_FAILED: Final = "The server failed while streaming this response."


class CompletionRoutes:
    """The two generation endpoints; everything but the prompt is shared."""

    def __init__(
        self,
        core: CoreClient,
        model: ServedModel,
        converter: Converter,
        metrics: Metrics,
        decoder: RequestDecoder,
        *,
        ping_interval_s: float = PING_INTERVAL_S,
        force_include_usage: bool = False,
    ) -> None:
        self._core = core
        self._model = model
        self._converter = converter
        self._metrics = metrics
        self._decoder = decoder
        self._ping_interval_s = ping_interval_s
        self._force_include_usage = force_include_usage

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = self._decoder.decode(await request.read(), ChatCompletionRequest)
        job = await self._converter.chat(req, request.headers)
        return await self._generate(request, job, arrival)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = self._decoder.decode(await request.read(), CompletionRequest)
        job = await self._converter.completion(req, request.headers)
        return await self._generate(request, job, arrival)

    async def _generate(
        self, request: web.Request, job: GenerationJob, arrival: float
    ) -> web.StreamResponse:
        # the request id is the core's id of the request (of its first prompt)
        rid = request[REQUEST_ID]
        kind = "chatcmpl" if job.chat else "cmpl"
        head = docs.Head(id=f"{kind}-{rid}", created=int(time.time()), model=self._model.model_id)
        fmt = (ChatFormat if job.chat else TextFormat)(
            head, self._model.tokenizer.token_bytes, job.logprobs
        )
        rids = [rid if p == 0 else f"{rid}-{p}" for p in range(len(job.prompts))]
        submits = [
            Submit(r, prompt.ids, job.params, job.priority, n=job.n, cache_salt=job.cache_salt)
            for r, prompt in zip(rids, job.prompts, strict=True)
        ]
        reply = _Reply(
            job=job,
            choices=[self._choice(job, p) for p in range(len(job.prompts)) for _ in range(job.n)],
            fmt=fmt,
            timer=RequestTimer(self._metrics, arrival),
            token_bytes=self._model.tokenizer.token_bytes,
            # last: nothing can fail after it
            stream=self._core.submit(submits),
        )
        try:
            if job.stream:
                return await self._stream(request, reply)
            return await self._collect(reply)
        except asyncio.CancelledError:  # the client went away
            reply.timer.abandon()
            raise
        finally:
            # a client gone (a failed write, or aiohttp cancelling this task), or an error: the
            # core still generates until told; release() sends the Abort without awaiting
            self._core.release(reply.stream)

    def _choice(self, job: GenerationJob, p: int) -> _Choice:
        decode = self._model.decode if job.skip_special_tokens else self._model.decode_special
        generation = Generation(
            decode,
            job.prompts[p].ids,
            job.stops,
            include_stop=job.include_stop,
            min_tokens=job.params.min_tokens,
        )
        return _Choice(p, job.prompts[p], generation, job.echo)

    async def _collect(self, reply: _Reply) -> web.Response:
        while not reply.done:
            item = await reply.stream.get()
            if isinstance(item, ServingError):
                raise reply.refusal(item)
            assert item is not None  # no timeout
            if reply.ended(item):
                continue
            piece, _ = self._push(reply, item)
            reply.choices[item.index].keep(piece)
        return json_response(
            reply.fmt.whole([reply.output(c) for c in reply.choices], reply.usage())
        )

    async def _stream(self, request: web.Request, reply: _Reply) -> web.StreamResponse:
        # A refusal before admission (429 full queue, 503) is a real HTTP status: the headers
        # wait for the core to queue every prompt, then pings keep the stream alive
        try:
            await reply.stream.admitted()
        except ServingError as e:
            raise reply.refusal(e) from None
        sse = SSEStream(request, request[REQUEST_ID])
        try:
            await sse.open()
            await self._relay(sse, reply)
        except ConnectionResetError:
            log.info("client went away during %s", reply.stream.rid)
            reply.timer.abandon()
        except Exception:
            log.exception("the stream of %s failed", reply.stream.rid)
            with contextlib.suppress(ConnectionError):
                await sse.error(ServingError(ErrorCode.INTERNAL_ERROR, _STREAM_FAILED))
        finally:
            if not sse.ended:  # the client left, or this task was cancelled: never a clean end
                sse.reset()
        return sse.response

    async def _relay(self, sse: SSEStream, reply: _Reply) -> None:
        """The stream's events, from the opening chunks to [DONE] or an error event."""
        job = reply.job
        for document in reply.fmt.opening(job.num_choices):
            await sse.send(document)
        while not reply.done:
            item = await reply.stream.get(self._ping_interval_s)
            if item is None:
                await sse.ping()
                continue
            if isinstance(item, ServingError):
                await sse.error(item)
                return
            if reply.ended(item):
                continue
            piece, first_token = self._push(reply, item)
            # finish_reason rides on the last text, or on a `delta: {}` of its own
            if piece.text or piece.finish_reason is not None:
                usage = reply.usage() if job.continuous_usage else None
                await sse.send(reply.fmt.chunk(item.index, piece, usage, first_token))
        if job.include_usage or self._force_include_usage:
            await sse.send(reply.fmt.usage_chunk(reply.usage()))
        await sse.done()

    def _push(self, reply: _Reply, event: TokenEvent) -> tuple[Piece, int | None]:
        """One choice's event: its piece of text, and the first token of an echoed prompt (which
        has no logprob) when the piece starts with it."""
        reply.timer.event(event)
        choice = reply.choices[event.index]
        piece, first_token = choice.push(event, reply.prompt_entries(choice.prompt_index, event))
        if choice.generation.stopped_by_string:
            self._core.abort_choice(reply.stream, event.index)
        if piece.finish_reason is not None:
            reply.num_finished += 1
            if reply.done:
                reply.timer.finish(
                    reply.num_prompt_tokens,
                    [c.generation.finish_reason or "" for c in reply.choices],
                )
        return piece, first_token


@dataclass(slots=True)
class _Choice:
    """One choice of a request: its generation, and its whole text when not streamed."""

    prompt_index: int
    prompt: Prompt
    generation: Generation
    echo: bool
    started: bool = False
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def push(
        self, event: TokenEvent, prompt_entries: list[TokenLogprob]
    ) -> tuple[Piece, int | None]:
        piece = self.generation.push(event)
        if self.started or not self.echo:
            self.started = True
            return piece, None
        self.started = True  # echo: the answer starts with the prompt and its tokens' logprobs
        text = self.prompt.text + piece.text
        return Piece(text, prompt_entries + piece.logprobs, piece.finish_reason), self.prompt.ids[0]

    def keep(self, piece: Piece) -> None:
        self.texts.append(piece.text)
        self.logprobs += piece.logprobs


@dataclass(slots=True)
class _Reply:
    """One submitted generation request and the state its response is built from."""

    job: GenerationJob
    choices: list[_Choice]
    fmt: Format
    timer: RequestTimer
    token_bytes: TokenBytes
    stream: RequestStream
    num_finished: int = 0
    # each prompt's logprobs, by prompt index: they come on the first event of its choice 0
    scored: dict[int, list[TokenLogprob]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.choices)

    def ended(self, event: TokenEvent) -> bool:
        """Whether the event's choice has ended already (at a stop string, with events of it
        still on their way)."""
        return self.choices[event.index].generation.finish_reason is not None

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt.ids) for prompt in self.job.prompts)

    def prompt_entries(self, p: int, event: TokenEvent) -> list[TokenLogprob]:
        """Prompt p's logprobs, as far as known (the event may be the one that brings them)."""
        if event.prompt_logprobs is not None:
            self.scored[p] = event.prompt_logprobs
        return self.scored.get(p, [])

    def output(self, choice: _Choice) -> ChoiceOutput:
        top = self.job.prompt_logprobs
        entries = self.scored.get(choice.prompt_index, [])
        return ChoiceOutput(
            text="".join(choice.texts),
            finish_reason=choice.generation.finish_reason or "",
            logprobs=choice.logprobs,
            first_token=choice.prompt.ids[0] if choice.echo else None,
            prompt_logprobs=None
            if top is None
            else docs.prompt_logprobs(entries, self.token_bytes, top),
        )

    def usage(self) -> docs.Usage:
        """Every prompt counted once, every generated token of every choice."""
        generated = sum(c.generation.num_tokens for c in self.choices)
        cached = sum(c.generation.num_cached_tokens for c in self.choices[:: self.job.n])
        return docs.usage(self.num_prompt_tokens, generated, cached)

    def refusal(self, error: ServingError) -> ServingError:
        """A context refusal from the core names no field; the request's prompt is the one."""
        if error.code is ErrorCode.CONTEXT_LENGTH_EXCEEDED and error.param is None:
            error.param = self.job.param
        return error

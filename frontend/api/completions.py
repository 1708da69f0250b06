"""POST /v1/chat/completions and /v1/completions: decode, convert, submit, stream (or collect)."""

from __future__ import annotations

import contextlib
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
from frontend.core.request_stream import Item, RequestStream
from frontend.openai import responses as docs
from frontend.openai.conversion import Converter, GenerationJob
from frontend.openai.formats import ChatFormat, Format, TextFormat
from frontend.openai.requests import ChatCompletionRequest, CompletionRequest, decode_request
from frontend.text.generation import Generation, Piece
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError
from shared.protocol import TokenEvent, TokenLogprob

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
        *,
        ping_interval_s: float = PING_INTERVAL_S,
    ) -> None:
        self._core = core
        self._model = model
        self._converter = converter
        self._metrics = metrics
        self._ping_interval_s = ping_interval_s

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = decode_request(await request.read(), ChatCompletionRequest)
        job = await self._converter.chat(req, request.headers)
        return await self._generate(request, job, arrival)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = decode_request(await request.read(), CompletionRequest)
        job = await self._converter.completion(req, request.headers)
        return await self._generate(request, job, arrival)

    async def _generate(
        self, request: web.Request, job: GenerationJob, arrival: float
    ) -> web.StreamResponse:
        rid = f"{'chatcmpl' if job.chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = docs.Head(id=rid, created=int(time.time()), model=self._model.model_id)
        kind = ChatFormat if job.chat else TextFormat
        token_bytes = self._model.tokenizer.token_bytes
        reply = _Reply(
            generation=Generation(self._model.decode, job.prompt_ids, job.stops),
            fmt=kind(head, token_bytes, job.params.logprobs is not None),
            timer=RequestTimer(self._metrics, arrival),
            num_prompt=len(job.prompt_ids),
            param=job.param,
            # last: nothing can fail after it
            stream=self._core.submit(rid, job.prompt_ids, job.params, job.priority),
        )
        try:
            if job.stream:
                return await self._stream(request, reply, job.include_usage)
            return await self._collect(reply)
        finally:
            # a stop string, a client gone (a failed write, or aiohttp cancelling this task):
            # the core still generates until told; release() sends the Abort without awaiting
            self._core.release(reply.stream)

    async def _collect(self, reply: _Reply) -> web.Response:
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        while reply.generation.finish_reason is None:
            item = await reply.stream.get()
            if isinstance(item, ServingError):
                raise reply.refusal(item)
            assert item is not None  # no timeout
            piece = reply.push(item)
            text.append(piece.text)
            logprobs += piece.logprobs
        reply.timer.finish()
        document = reply.fmt.whole(
            "".join(text), reply.generation.finish_reason, reply.usage(), logprobs
        )
        return json_response(document)

    async def _stream(
        self, request: web.Request, reply: _Reply, include_usage: bool
    ) -> web.StreamResponse:
        # A refusal (429 full queue, 503) comes before any token: it must be a real HTTP
        # status, so the headers wait for the first event.
        item = await reply.stream.get()
        if isinstance(item, ServingError):
            raise reply.refusal(item)
        sse = SSEStream(request)
        try:
            await sse.open()
            await self._relay(sse, reply, item, include_usage)
        except ConnectionResetError:
            log.info("client went away during %s", reply.stream.rid)
        except Exception:
            log.exception("the stream of %s failed", reply.stream.rid)
            with contextlib.suppress(ConnectionError):
                await sse.error(ServingError(ErrorCode.INTERNAL_ERROR, _STREAM_FAILED))
        finally:
            if not sse.ended:  # the client left, or this task was cancelled: never a clean end
                sse.reset()
        return sse.response

    async def _relay(
        self, sse: SSEStream, reply: _Reply, item: Item | None, include_usage: bool
    ) -> None:
        """The stream's events, from the first core event to [DONE] or an error event."""
        for document in reply.fmt.opening():
            await sse.send(document)
        while True:
            if item is None:
                await sse.ping()
            elif isinstance(item, ServingError):
                await sse.error(item)
                return
            else:
                piece = reply.push(item)
                # finish_reason rides on the last text, or on a `delta: {}` of its own
                if piece.text or piece.finish_reason is not None:
                    await sse.send(reply.fmt.chunk(piece))
                if piece.finish_reason is not None:
                    break
            item = await reply.stream.get(self._ping_interval_s)
        reply.timer.finish()
        if include_usage:
            await sse.send(reply.fmt.usage_chunk(reply.usage()))
        await sse.done()


@dataclass(slots=True)
class _Reply:
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

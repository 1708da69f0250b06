"""Server-sent events: the only place `data: ...\n\n` is written."""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from shared.errors import ServingError

CONTENT_TYPE: Final = "text/event-stream"
PING: Final = b": ping\n\n"
DONE: Final = b"data: [DONE]\n\n"
_ENCODER: Final = msgspec.json.Encoder()


class SSEStream:
    """One text/event-stream response; each event is written (flushed) as soon as it exists."""

    __slots__ = ("request_id", "response")

    def __init__(self, response: web.StreamResponse, request_id: str | None = None) -> None:
        self.response = response
        self.request_id = request_id  # named in an error event

    @classmethod
    async def open(cls, request: web.Request, request_id: str | None = None) -> SSEStream:
        """Send the status line and headers: from here on, errors travel as events."""
        response = web.StreamResponse(
            status=200,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        response.content_type = CONTENT_TYPE
        await response.prepare(request)
        return cls(response, request_id)

    async def send(self, document: object) -> None:
        await self.response.write(b"data: " + _ENCODER.encode(document) + b"\n\n")

    async def ping(self) -> None:
        await self.response.write(PING)

    async def error(self, error: ServingError) -> None:
        """An OpenAI-shaped error event; the stream ends without [DONE]."""
        await self.send(error.to_document(self.request_id))
        await self.response.write_eof()

    async def done(self) -> None:
        await self.response.write(DONE)
        await self.response.write_eof()

"""Server-sent events: the only place `data: ...\n\n` is written."""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Final

import msgspec
from aiohttp import web

from shared.errors import ServingError

CONTENT_TYPE: Final = "text/event-stream"
PING: Final = b": ping\n\n"
DONE: Final = b"data: [DONE]\n\n"
_ENCODER: Final = msgspec.json.Encoder()
_LINGER_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


class SSEStream:
    """One text/event-stream response; each event is written (flushed) as soon as it exists.

    A stream ends with `[DONE]` or with an error event. One that cannot (the client left, the
    handler failed or was cancelled) is `reset()`: a clean end of the chunked body would let a
    client take what it got for the whole answer.
    """

    __slots__ = ("_request", "ended", "request_id", "response")

    def __init__(self, request: web.Request, request_id: str | None = None) -> None:
        self._request = request
        self.request_id = request_id  # named in an error event
        self.response = web.StreamResponse(
            status=200,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.response.content_type = CONTENT_TYPE
        self.ended = False  # [DONE] or an error event went out, and the end of the body

    async def open(self) -> None:
        """Send the status line and headers: from here on, errors travel as events."""
        await self.response.prepare(self._request)

    async def send(self, document: object) -> None:
        await self.response.write(b"data: " + _ENCODER.encode(document) + b"\n\n")

    async def ping(self) -> None:
        await self.response.write(PING)

    async def error(self, error: ServingError) -> None:
        """An OpenAI-shaped error event; the stream ends without [DONE]."""
        await self.send(error.to_document(self.request_id))
        await self.response.write_eof()
        self.ended = True

    async def done(self) -> None:
        await self.response.write(DONE)
        await self.response.write_eof()
        self.ended = True

    def reset(self) -> None:
        """Cut the connection with a TCP reset, whatever is still unsent."""
        transport = self._request.transport
        if transport is None:
            return  # closed already
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # the peer closed first: abort() still closes
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        transport.abort()

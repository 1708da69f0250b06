"""Server-sent events as OpenAI-compatible servers stream them: framing and chunk contents."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import msgspec

DONE: Final = "[DONE]"


class SSEDecoder:
    """Incremental SSE framing: feed bytes as they arrive, get each complete event's data."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every event completed by `chunk` (multi-line data joined by newlines)."""
        self._buffer += chunk
        events: list[str] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            # decode whole lines only: a read may split a multi-byte character
            line = self._buffer[:end].rstrip(b"\r").decode()
            self._buffer = self._buffer[end + 1 :]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[len("data:") :]
                self._data.append(value[1:] if value.startswith(" ") else value)
            # comments (": ping") and other fields (event:, id:, retry:) carry no tokens
        return events


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None  # chat
    text: str | None = None  # completions


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    error: Any = None


_DECODER: Final = msgspec.json.Decoder(_Chunk)


class ChunkInfo(NamedTuple):
    """What one streamed chunk says: its text, the usage if it carries one, an error if any."""

    text: str
    usage: tuple[int, int] | None  # (prompt_tokens, completion_tokens)
    error: str | None


def read_chunk(data: str) -> ChunkInfo:
    """Parse one chat.completion.chunk or text_completion chunk (or an error event)."""
    try:
        chunk = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        return ChunkInfo("", None, f"undecodable chunk: {exc}: {data[:200]!r}")
    if chunk.error is not None:
        return ChunkInfo("", None, str(chunk.error)[:500])
    parts: list[str] = []
    for choice in chunk.choices:
        if choice.delta is not None:
            parts += [choice.delta.reasoning_content or "", choice.delta.content or ""]
        parts.append(choice.text or "")
    usage = chunk.usage
    counts = None if usage is None else (usage.prompt_tokens, usage.completion_tokens)
    return ChunkInfo("".join(parts), counts, None)

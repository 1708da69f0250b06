"""The documents of one generation response, chat or text: whole, or chunk by chunk."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from frontend.openai import responses as docs
from frontend.text.generation import Piece
from shared.protocol import TokenLogprob

TokenBytes = Callable[[int], bytes]


class ChatFormat:
    """chat.completion, and the chat.completion.chunk stream (role first)."""

    def __init__(self, head: docs.Head, token_bytes: TokenBytes, logprobs: bool) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._logprobs = logprobs

    def opening(self) -> list[docs.ChatCompletionChunk]:
        return [docs.chat_role_chunk(self.head)]

    def chunk(self, piece: Piece) -> docs.ChatCompletionChunk:
        # a finish with no text left is `delta: {}`
        content = piece.text if piece.text or piece.finish_reason is None else None
        return docs.chat_chunk(self.head, content, piece.finish_reason, self._log(piece.logprobs))

    def whole(
        self, text: str, finish_reason: str, usage: docs.Usage, logprobs: Sequence[TokenLogprob]
    ) -> docs.ChatCompletion:
        return docs.chat_completion(self.head, text, finish_reason, usage, self._log(logprobs))

    def usage_chunk(self, usage: docs.Usage) -> docs.ChatCompletionChunk:
        return docs.chat_usage_chunk(self.head, usage)

    def _log(self, entries: Sequence[TokenLogprob]) -> docs.ChatLogprobs | None:
        return docs.chat_logprobs(entries, self._token_bytes) if self._logprobs else None


class TextFormat:
    """text_completion, whole or as stream chunks (no role chunk)."""

    def __init__(self, head: docs.Head, token_bytes: TokenBytes, logprobs: bool) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._logprobs = logprobs
        self._offset = 0  # characters sent so far: logprobs' text_offset

    def opening(self) -> list[docs.TextCompletion]:
        return []

    def chunk(self, piece: Piece) -> docs.TextCompletion:
        logprobs = self._log(piece.logprobs, self._offset)
        self._offset += len(piece.text)
        return docs.text_completion(self.head, piece.text, piece.finish_reason, None, logprobs)

    def whole(
        self, text: str, finish_reason: str, usage: docs.Usage, logprobs: Sequence[TokenLogprob]
    ) -> docs.TextCompletion:
        return docs.text_completion(self.head, text, finish_reason, usage, self._log(logprobs, 0))

    def usage_chunk(self, usage: docs.Usage) -> docs.TextCompletion:
        return docs.text_usage_chunk(self.head, usage)

    def _log(self, entries: Sequence[TokenLogprob], offset: int) -> docs.CompletionLogprobs | None:
        if not self._logprobs:
            return None
        return docs.completion_logprobs(entries, self._token_bytes, offset)


Format = ChatFormat | TextFormat

"""The documents of one generation response, chat or text: whole, or chunk by chunk.

`chunk` returns None when a piece has nothing to show yet (text a tool-call parser holds
back); its logprobs then ride with the next chunk that is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from frontend.openai import responses as docs
from frontend.text.generation import Piece
from frontend.text.tool_calls import CallDelta, ToolCallParser
from shared.protocol import FinishReason, TokenLogprob

TokenBytes = Callable[[int], bytes]


class ChatFormat:
    """chat.completion, and the chat.completion.chunk stream (role first); with a tool-call
    parser, the reply's calls are `tool_calls` and its finish `tool_calls`."""

    def __init__(
        self,
        head: docs.Head,
        token_bytes: TokenBytes,
        logprobs: bool,
        tools: ToolCallParser | None = None,
    ) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._logprobs = logprobs
        self._tools = tools
        self._held: list[TokenLogprob] = []  # logprobs of pieces that showed nothing yet

    def opening(self) -> list[docs.ChatCompletionChunk]:
        return [docs.chat_role_chunk(self.head)]

    def chunk(self, piece: Piece) -> docs.ChatCompletionChunk | None:
        text, deltas, finish = piece.text, [], piece.finish_reason
        if self._tools is not None:
            parsed = self._tools.push(text)
            if finish is not None:
                end = self._tools.finish()
                parsed = parsed._replace(content=parsed.content + end.content)
                parsed.calls.extend(end.calls)
            text, deltas, finish = parsed.content, parsed.calls, self._finish(finish)
        self._held += piece.logprobs
        if not text and not deltas and finish is None:
            return None
        logprobs, self._held = self._held, []
        return docs.chat_chunk(
            self.head,
            text if text or (finish is None and not deltas) else None,  # a bare finish: `{}`
            finish,
            self._log(logprobs),
            [_delta(d) for d in deltas] or None,
        )

    def whole(
        self, text: str, finish_reason: str, usage: docs.Usage, logprobs: Sequence[TokenLogprob]
    ) -> docs.ChatCompletion:
        if self._tools is None:
            return docs.chat_completion(self.head, text, finish_reason, usage, self._log(logprobs))
        self._tools.push(text)
        self._tools.finish()
        calls = [
            docs.ToolCallDoc(
                id=c.id,
                type="function",
                function=docs.FunctionCallDoc(name=c.name, arguments=c.arguments),
            )
            for c in self._tools.calls
        ]
        finish = self._finish(finish_reason)
        assert finish is not None
        return docs.chat_completion(
            self.head,
            self._tools.content or None,
            finish,
            usage,
            self._log(logprobs),
            calls or None,
        )

    def _finish(self, finish_reason: str | None) -> str | None:
        """A reply that made calls and stopped finishes with `tool_calls`."""
        if finish_reason == FinishReason.STOP and self._tools is not None and self._tools.calls:
            return "tool_calls"
        return finish_reason

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

    def chunk(self, piece: Piece) -> docs.TextCompletion | None:
        if not piece.text and piece.finish_reason is None:
            return None
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


def _delta(delta: CallDelta) -> docs.DeltaToolCall:
    """A call's first delta names it (arguments ""); the others carry argument fragments."""
    if delta.name is None:
        return docs.DeltaToolCall(
            index=delta.index, function=docs.DeltaFunction(arguments=delta.arguments)
        )
    return docs.DeltaToolCall(
        index=delta.index,
        id=delta.id,
        type="function",
        function=docs.DeltaFunction(name=delta.name, arguments=delta.arguments),
    )

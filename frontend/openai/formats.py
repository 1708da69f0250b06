"""The documents of one generation response, chat or text: whole, or chunk by chunk, for each of
its choices.

`chunk` returns None when a piece has nothing to show yet (text a tool-call parser holds
back); its logprobs then ride with the choice's next chunk that is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from frontend.openai import responses as docs
from frontend.text.generation import Piece
from frontend.text.tool_calls import CallDelta, ToolCallParser
from shared.protocol import FinishReason, TokenLogprob

TokenBytes = Callable[[int], bytes]


class ChoiceOutput(NamedTuple):
    """One choice's whole answer."""

    text: str
    finish_reason: str
    logprobs: list[TokenLogprob]
    first_token: int | None  # echo: the prompt's first token, which has no logprob
    prompt_logprobs: docs.PromptLogprobs | None  # vLLM's prompt_logprobs, when asked for


class ChatFormat:
    """chat.completion, and the chat.completion.chunk stream (role first, for each choice); with
    tool-call parsers (one per choice, from `tools`), a reply's calls are `tool_calls` and its
    finish `tool_calls`."""

    def __init__(
        self,
        head: docs.Head,
        token_bytes: TokenBytes,
        logprobs: int | None,
        tools: Callable[[], ToolCallParser] | None = None,
    ) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._logprobs = logprobs is not None
        self._tools = tools
        self._parsers: dict[int, ToolCallParser] = {}  # by choice, streamed
        self._held: dict[int, list[TokenLogprob]] = {}  # logprobs of pieces that showed nothing

    def opening(self, num_choices: int) -> list[docs.ChatCompletionChunk]:
        return [docs.chat_role_chunk(self.head, i) for i in range(num_choices)]

    def chunk(
        self,
        index: int,
        piece: Piece,
        usage: docs.Usage | None = None,
        first_token: int | None = None,
    ) -> docs.ChatCompletionChunk | None:
        text, deltas, finish = piece.text, [], piece.finish_reason
        if self._tools is not None:
            parser = self._parsers.get(index)
            if parser is None:
                parser = self._parsers[index] = self._tools()
            parsed = parser.push(text)
            if finish is not None:
                end = parser.finish()
                parsed = parsed._replace(content=parsed.content + end.content)
                parsed.calls.extend(end.calls)
            text, deltas, finish = parsed.content, parsed.calls, _finish(finish, parser)
        held = self._held.setdefault(index, [])
        held += piece.logprobs
        if not text and not deltas and finish is None:
            return None
        self._held[index] = []
        return docs.chat_chunk(
            self.head,
            text if text or (finish is None and not deltas) else None,  # a bare finish: `{}`
            finish,
            self._log(held),
            [_delta(d) for d in deltas] or None,
            index=index,
            usage=usage,
        )

    def whole(self, outputs: Sequence[ChoiceOutput], usage: docs.Usage) -> docs.ChatCompletion:
        choices = [self._choice(i, out) for i, out in enumerate(outputs)]
        return docs.chat_completion(self.head, choices, usage, outputs[0].prompt_logprobs)

    def _choice(self, index: int, out: ChoiceOutput) -> docs.ChatChoice:
        logprobs = self._log(out.logprobs)
        if self._tools is None:
            return docs.chat_choice(index, out.text, out.finish_reason, logprobs)
        parser = self._tools()
        parser.push(out.text)
        parser.finish()
        calls = [
            docs.ToolCallDoc(
                id=c.id,
                type="function",
                function=docs.FunctionCallDoc(name=c.name, arguments=c.arguments),
            )
            for c in parser.calls
        ]
        finish = _finish(out.finish_reason, parser)
        assert finish is not None
        return docs.chat_choice(index, parser.content or None, finish, logprobs, calls or None)

    def usage_chunk(self, usage: docs.Usage) -> docs.ChatCompletionChunk:
        return docs.chat_usage_chunk(self.head, usage)

    def _log(self, entries: Sequence[TokenLogprob]) -> docs.ChatLogprobs | None:
        return docs.chat_logprobs(entries, self._token_bytes) if self._logprobs else None


class TextFormat:
    """text_completion, whole or as stream chunks (no role chunk)."""

    def __init__(self, head: docs.Head, token_bytes: TokenBytes, logprobs: int | None) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._top = logprobs
        self._offsets: dict[int, int] = {}  # characters sent so far, by choice: text_offset

    def opening(self, num_choices: int) -> list[docs.TextCompletion]:
        return []

    def chunk(
        self,
        index: int,
        piece: Piece,
        usage: docs.Usage | None = None,
        first_token: int | None = None,
    ) -> docs.TextCompletion | None:
        if not piece.text and piece.finish_reason is None:
            return None
        offset = self._offsets.get(index, 0)
        logprobs = self._log(piece.logprobs, offset, first_token)
        self._offsets[index] = offset + len(piece.text)
        choice = docs.text_choice(index, piece.text, piece.finish_reason, logprobs)
        return docs.text_completion(self.head, [choice], usage)

    def whole(self, outputs: Sequence[ChoiceOutput], usage: docs.Usage) -> docs.TextCompletion:
        choices = [
            docs.text_choice(
                i,
                out.text,
                out.finish_reason,
                self._log(out.logprobs, 0, out.first_token),
                out.prompt_logprobs,
            )
            for i, out in enumerate(outputs)
        ]
        return docs.text_completion(self.head, choices, usage)

    def usage_chunk(self, usage: docs.Usage) -> docs.TextCompletion:
        return docs.text_usage_chunk(self.head, usage)

    def _log(
        self, entries: Sequence[TokenLogprob], offset: int, first_token: int | None
    ) -> docs.CompletionLogprobs | None:
        if self._top is None:
            return None
        return docs.completion_logprobs(
            entries, self._token_bytes, offset, first_token=first_token, top_n=self._top
        )


Format = ChatFormat | TextFormat


def _finish(finish_reason: str | None, parser: ToolCallParser) -> str | None:
    """A reply that made calls and stopped finishes with `tool_calls`."""
    if finish_reason == FinishReason.STOP and parser.calls:
        return "tool_calls"
    return finish_reason


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

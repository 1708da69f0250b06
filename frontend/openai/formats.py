"""The documents of one generation response, chat or text: whole, or chunk by chunk, for each of
its choices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from frontend.openai import responses as docs
from frontend.text.generation import Piece
from shared.protocol import TokenLogprob

TokenBytes = Callable[[int], bytes]


class ChoiceOutput(NamedTuple):
    """One choice's whole answer."""

    text: str
    finish_reason: str
    logprobs: list[TokenLogprob]
    first_token: int | None  # echo: the prompt's first token, which has no logprob
    prompt_logprobs: docs.PromptLogprobs | None  # vLLM's prompt_logprobs, when asked for


class ChatFormat:
    """chat.completion, and the chat.completion.chunk stream (role first, for each choice)."""

    def __init__(self, head: docs.Head, token_bytes: TokenBytes, logprobs: int | None) -> None:
        self.head = head
        self._token_bytes = token_bytes
        self._logprobs = logprobs is not None

    def opening(self, num_choices: int) -> list[docs.ChatCompletionChunk]:
        return [docs.chat_role_chunk(self.head, i) for i in range(num_choices)]

    def chunk(
        self,
        index: int,
        piece: Piece,
        usage: docs.Usage | None = None,
        first_token: int | None = None,
    ) -> docs.ChatCompletionChunk:
        # a finish with no text left is `delta: {}`
        content = piece.text if piece.text or piece.finish_reason is None else None
        logprobs = self._log(piece.logprobs)
        return docs.chat_chunk(
            self.head, content, piece.finish_reason, logprobs, index=index, usage=usage
        )

    def whole(self, outputs: Sequence[ChoiceOutput], usage: docs.Usage) -> docs.ChatCompletion:
        choices = [
            docs.chat_choice(i, out.text, out.finish_reason, self._log(out.logprobs))
            for i, out in enumerate(outputs)
        ]
        return docs.chat_completion(self.head, choices, usage, outputs[0].prompt_logprobs)

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
    ) -> docs.TextCompletion:
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

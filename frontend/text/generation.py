"""Generation: one request's generated tokens turned into text that is safe to send."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from frontend.text.detokenizer import Detokenizer
from frontend.text.stops import StopMatcher
from shared.protocol import FinishReason, TokenEvent, TokenLogprob


class Piece(NamedTuple):
    """What one TokenEvent releases: text, the logprobs of the tokens behind it, the finish."""

    text: str
    logprobs: list[TokenLogprob]
    finish_reason: str | None  # set on the last piece only


class Generation:
    """Detokenize, hold back what could start a stop string, cut at one, count every token.

    The stop token that ends a generation is not part of its text, nor a stop string (unless
    `include_stop`); stop strings are looked for only in the text after the first
    `min_tokens` tokens.
    """

    __slots__ = (
        "_detokenizer",
        "_held_logprobs",
        "_include_stop",
        "_min_tokens",
        "_stops",
        "finish_reason",
        "num_cached_tokens",
        "num_tokens",
        "stopped_by_string",
    )

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        prompt_ids: Sequence[int],
        stops: list[str],
        *,
        include_stop: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self._detokenizer = Detokenizer(decode, prompt_ids)
        self._stops = StopMatcher(stops, include_stop)
        self._include_stop = include_stop
        self._min_tokens = min_tokens
        self._held_logprobs: list[TokenLogprob] = []
        self.num_tokens = 0  # every generated token, EOS included
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None
        self.stopped_by_string = False  # the core does not know: it must be told to abort

    def push(self, event: TokenEvent) -> Piece:
        assert self.finish_reason is None, "push after the finish"
        if self.num_tokens == 0:
            self.num_cached_tokens = event.num_cached_tokens
        ids = event.token_ids
        if event.finish is FinishReason.STOP and not self._include_stop:
            ids = ids[:-1]  # the stop token: the core stops only on one
        unmatched = max(0, self._min_tokens - self.num_tokens)
        self.num_tokens += len(event.token_ids)
        self._held_logprobs += event.logprobs or ()
        free = self._detokenizer.push(ids[:unmatched])  # before min_tokens: no stop string
        text = self._detokenizer.push(ids[unmatched:])
        if event.finish is not None:
            text += self._detokenizer.flush()
        if len(ids) <= unmatched:
            free, text = free + text, ""
        out = free + self._stops.push(text)
        if self._stops.stopped:
            self.finish_reason = FinishReason.STOP.value
            self.stopped_by_string = event.finish is None
        elif event.finish is not None:
            out += self._stops.finish()
            # only stop and length reach here: the core client turns abort and error into errors
            self.finish_reason = (
                FinishReason.LENGTH.value
                if event.finish is FinishReason.LENGTH
                else FinishReason.STOP.value
            )
        if not out and self.finish_reason is None:
            return Piece("", [], None)  # held back: its logprobs ride with the text they make
        logprobs, self._held_logprobs = self._held_logprobs, []
        return Piece(out, logprobs, self.finish_reason)

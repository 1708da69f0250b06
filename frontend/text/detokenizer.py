"""Incremental detokenization that never splits a UTF-8 character (vLLM/TGI offsets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what decode() writes for bytes that are not (yet) a whole character
PROMPT_CONTEXT = 5  # prompt ids kept as left context, so the first token's leading space is right


class Detokenizer:
    """Turns a growing list of token ids into text deltas.

    ids[prefix:read] decoded is text already emitted, kept as left context; the text after
    it is emitted once it no longer ends in an incomplete character.
    """

    __slots__ = ("_decode", "_ids", "_prefix", "_read")

    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids = list(prompt_ids[-PROMPT_CONTEXT:]) if prompt_ids else []
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, ids: Sequence[int]) -> str:
        """Add generated ids; return the new text that is complete, possibly ''."""
        self._ids.extend(ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character becomes U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text):
            # Nothing visible yet (e.g. skipped special tokens); stay put, the ids are kept.
            return ""
        if new_text.endswith(REPLACEMENT) and not final:
            return ""
        # Ids before the old read offset are no longer needed as context.
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        return new_text[len(prefix_text) :]

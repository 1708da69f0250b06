"""ServedModel: the text side of the one model this frontend serves (id, tokenizer, template)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Final

from frontend.openai.responses import ModelCard
from frontend.text.chat_template import DEFAULT_TEMPLATE, ChatTemplate
from shared.errors import ErrorCode, ServingError
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import read_card

OWNED_BY: Final = "tl-serve"
LONG_TEXT_CHARS: Final = (
    32_768  # tokenize longer texts off the event loop (tokenizers drops the GIL)
)
_BYTE_FALLBACK: Final = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in char -> the byte it stands for (ByteLevel's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {char: b for b, char in chars.items()}


class ServedModel:
    """What requests name and what their text becomes: the served id, tokens, chat prompt."""

    def __init__(self, model_id: str, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.template = template
        self.created = int(time.time())
        self._alphabet = _byte_level_alphabet()
        self._added = {i: t.content for i, t in tokenizer.hf.get_added_tokens_decoder().items()}

    @classmethod
    def load(cls, path: Path, model_id: str) -> ServedModel:
        """Read the model's card: tokenizer and chat template (DEFAULT_TEMPLATE if it has none)."""
        card = read_card(path)
        template = ChatTemplate(
            card.chat_template or DEFAULT_TEMPLATE, card.bos_token, card.eos_token
        )
        return cls(model_id, Tokenizer(card), template)

    def check(self, requested: str) -> None:
        if requested != self.model_id:
            raise ServingError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{requested}' does not exist; this server serves '{self.model_id}'.",
                "model",
            )

    def card(self) -> ModelCard:
        return ModelCard(id=self.model_id, created=self.created, owned_by=OWNED_BY)

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        """Generated text: special tokens (EOS, turn markers) are not part of it."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token, for logprobs (a token may hold part of a character)."""
        added = self._added.get(token_id)
        if added is not None:
            return added.encode()
        piece = self.tokenizer.id_to_token(token_id) or ""
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback is not None:
            return bytes([int(fallback[1], 16)])
        if all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        return piece.replace("\u2581", " ").encode()  # SentencePiece's word marker

"""ServedModel: the text side of the one model this frontend serves (id, tokenizer, template)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from frontend.text.chat_template import DEFAULT_TEMPLATE, ChatTemplate
from shared.errors import ErrorCode, ServingError
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import read_tokenizer_metadata

LONG_TEXT_CHARS: Final = (
    32_768  # tokenize longer texts off the event loop (tokenizers drops the GIL)
)


class ServedModel:
    """What requests name and what their text becomes: the served id, tokens, chat prompt."""

    def __init__(self, model_id: str, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.template = template
        self.created = int(time.time())  # unix seconds: the `created` of its /v1/models entry

    @classmethod
    def load(cls, path: Path, model_id: str) -> ServedModel:
        """Read the model's metadata: tokenizer and chat template (DEFAULT_TEMPLATE if it has none)."""
        metadata = read_tokenizer_metadata(path)
        template = ChatTemplate(
            metadata.chat_template or DEFAULT_TEMPLATE,
            metadata.bos_token,
            metadata.eos_token,
            tool_use_source=metadata.tool_use_template,
        )
        return cls(model_id, Tokenizer(metadata), template)

    def check(self, requested: str) -> None:
        if requested != self.model_id:
            raise ServingError(
                ErrorCode.MODEL_NOT_FOUND,
                f"The model '{requested}' does not exist; this server serves '{self.model_id}'.",
                "model",
            )

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > LONG_TEXT_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        """Generated text: special tokens (EOS, turn markers) are not part of it."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

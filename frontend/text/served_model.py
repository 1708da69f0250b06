"""ServedModel: the text side of the one model this frontend serves (id, tokenizer, template)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from frontend.text.chat_template import DEFAULT_TEMPLATE, ChatTemplate
from shared.errors import ErrorCode, ServingError
from shared.gguf_file import gguf_reader
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import read_tokenizer_metadata

LONG_TEXT_CHARS: Final = (
    32_768  # tokenize longer texts off the event loop (tokenizers drops the GIL)
)


class ServedModel:
    """What requests name and what their text becomes: the served ids, tokens, chat prompt."""

    def __init__(
        self, model_ids: str | tuple[str, ...], tokenizer: Tokenizer, template: ChatTemplate
    ) -> None:
        self.model_ids = (model_ids,) if isinstance(model_ids, str) else model_ids
        self.model_id = self.model_ids[0]  # the canonical id: what responses carry
        self.tokenizer = tokenizer
        self.template = template
        self.created = int(time.time())  # unix seconds: the `created` of its /v1/models entries

    @classmethod
    def load(
        cls, path: Path, model_ids: str | tuple[str, ...], chat_template: str = ""
    ) -> ServedModel:
        """Read the model's metadata: tokenizer and chat template (`chat_template` if given, a
        file or the template itself; else the model's own; else DEFAULT_TEMPLATE)."""
        metadata = read_tokenizer_metadata(path)
        # the parsed file (one Python object per vocabulary entry) is cached for the core's
        # loader; a frontend needs nothing more of it
        gguf_reader.cache_clear()
        override = template_source(chat_template)
        template = ChatTemplate(
            override or metadata.chat_template or DEFAULT_TEMPLATE,
            metadata.bos_token,
            metadata.eos_token,
            # an override is the whole template: the model's tool_use one goes with the model's
            tool_use_source=None if override else metadata.tool_use_template,
        )
        return cls(model_ids, Tokenizer(metadata), template)

    def check(self, requested: str) -> None:
        if requested not in self.model_ids:
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

    def decode_special(self, ids: list[int]) -> str:
        """Text with the special tokens written out (skip_special_tokens: false, prompts)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def template_source(setting: str) -> str:
    """runtime.toml's chat_template: the template itself (it holds a Jinja tag), else a file."""
    if not setting or "{{" in setting or "{%" in setting:
        return setting
    return Path(setting).expanduser().read_text()

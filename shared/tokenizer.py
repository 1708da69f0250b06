"""The model's tokenizer, built from its metadata for both processes: text to token ids and
back (HF `tokenizers`), and the raw bytes of every token id."""

from __future__ import annotations

import re
from typing import Final

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from shared.tokenizer_metadata import CONTROL, USER_DEFINED, TokenizerMetadata

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


def _from_gguf(metadata: TokenizerMetadata) -> HFTokenizer:
    """Byte-level BPE from GGUF vocab and merges (tokenizer.ggml.model == "gpt2")."""
    vocab = {text: i for i, text in enumerate(metadata.tokens)}
    merges = [(a, b) for a, b in (m.split(" ") for m in metadata.merges)]
    hf = HFTokenizer(models.BPE(vocab, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if metadata.pre_tokenizer == "smollm":
        # llama.cpp's "smollm" pre-tokenizer (the original SmolLM2 tokenizer.json) splits digits
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        hf.pre_tokenizer = byte_level
    hf.decoder = decoders.ByteLevel()
    # control tokens written in the text are matched whole, before pre-tokenization, as
    # llama.cpp does with parse_special; user-defined tokens too, but they decode as text
    kinds = list(zip(metadata.tokens, metadata.token_types, strict=True))
    specials = [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == CONTROL]
    users = [AddedToken(t, normalized=False) for t, k in kinds if k == USER_DEFINED]
    hf.add_special_tokens(specials)
    hf.add_tokens(users)
    return hf


class Tokenizer:
    """The model's tokenizer: special tokens written in the text are parsed as special tokens."""

    def __init__(self, metadata: TokenizerMetadata) -> None:
        self.hf = (
            _from_gguf(metadata)
            if metadata.tokenizer_json is None
            else HFTokenizer.from_str(metadata.tokenizer_json)
        )
        self.eos_ids = list(metadata.eos_ids)
        self.bos_id = metadata.bos_id
        self.bos_token = metadata.bos_token
        self.eos_token = metadata.eos_token
        self._add_bos = metadata.add_bos
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self._alphabet = _byte_level_alphabet()
        self._added = {i: t.content for i, t in self.hf.get_added_tokens_decoder().items()}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; add_special_tokens prepends BOS if the model asks for it (never EOS)."""
        # tokenizer.json post-processors are bypassed so GGUF and HF models behave alike
        ids: list[int] = self.hf.encode(text, add_special_tokens=False).ids
        bos_id = self.bos_id if add_special_tokens and self._add_bos else None
        if bos_id is not None and ids[:1] != [bos_id]:
            ids.insert(0, bos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ids (byte-level: lossless when special tokens are kept)."""
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id (byte-level form, e.g. "Ġhello"), None if out of range."""
        return self.hf.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry, None if there is none."""
        return self.hf.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a token may hold part of a character); b"" if unknown."""
        added = self._added.get(token_id)
        if added is not None:
            return added.encode()
        piece = self.id_to_token(token_id) or ""
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback is not None:
            return bytes([int(fallback[1], 16)])
        if all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        return piece.replace("\u2581", " ").encode()  # SentencePiece's word marker

    def vocabulary(self) -> list[bytes]:
        """The raw bytes of every token id, 0 .. vocab_size - 1 (for grammar masks)."""
        return [self.token_bytes(i) for i in range(self.vocab_size)]

    def new_decode_stream(self, skip_special_tokens: bool) -> decoders.DecodeStream:
        """A fresh incremental decoder; feed it with `stream.step(tokenizer.hf, token_id)`."""
        return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

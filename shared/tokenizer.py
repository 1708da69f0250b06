"""The model's tokenizer, built from its metadata for both processes: text to token ids and
back (HF `tokenizers`), and the raw bytes of every token id.

A tokenizer.json is loaded as it is. A GGUF vocabulary is rebuilt from its metadata the way
llama.cpp reads it, with `tokenizers`' own parts:

- "gpt2": byte-level BPE. tokenizer.ggml.pre names the regexes that split the text into words
  first (applied one after another, as llama.cpp applies its lists), then GPT-2's byte alphabet.
- "llama": SentencePiece BPE with byte fallback. The merges are not in the file: two pieces
  merge when their concatenation is a piece, the higher its score the earlier (what
  SentencePiece does). Spaces are "▁"; a space starts the text and each text after a special
  token unless tokenizer.ggml.add_space_prefix is false (Gemma 2 and 3).
- "gemma4": BPE with the file's merges over SentencePiece-style pieces (raw UTF-8, "▁" for a
  space), words split only at newlines, byte fallback.
"""

from __future__ import annotations

import re
from typing import Final

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from shared.tokenizer_metadata import (
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    TokenizerMetadata,
)

_BYTE_FALLBACK: Final = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SPACE: Final = "\u2581"  # SentencePiece's word marker, "▁"

_GPT2_WORDS: Final = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Llama 3's, Qwen 2's and Qwen 3.5's own regexes (their tokenizer.json): they differ in how
# many digits make a word and whether combining marks join letters
_LLAMA3_WORDS: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_WORDS: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_WORDS: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> its word-splitting regexes (keys: BPE_PRE_TOKENIZERS)
_BPE_SPLITS: Final = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2_WORDS, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [_GPT2_WORDS],
    "smollm": [r"\p{N}", _GPT2_WORDS],  # every digit alone
    "llama-bpe": [_LLAMA3_WORDS],
    "qwen2": [_QWEN2_WORDS],
    "qwen35": [_QWEN35_WORDS],
}
# Qwen 2's tokenizer.json composes characters (NFC) before splitting; Qwen 3.5's does not
_BPE_NFC: Final = frozenset({"qwen2"})
# Llama 3's BPE takes a whole word that is in the vocabulary as one token, merges or not
_BPE_IGNORE_MERGES: Final = frozenset({"llama-bpe"})


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


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    # at the first space after the first character, as llama.cpp splits them
    return [(m[: (i := m.index(" ", 1))], m[i + 1 :]) for m in merges]


def _sentencepiece_merges(metadata: TokenizerMetadata) -> list[tuple[str, str]]:
    """SentencePiece's merge order as BPE merges: every split of a piece into two pieces, by
    the score of the whole piece (highest first), then by the ids of the two halves."""
    kinds = zip(metadata.tokens, metadata.scores, metadata.token_types, strict=True)
    pieces = {t: (i, s) for i, (t, s, k) in enumerate(kinds) if k == NORMAL}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, (_, score) in pieces.items():
        for cut in range(1, len(piece)):
            left, right = pieces.get(piece[:cut]), pieces.get(piece[cut:])
            if left is not None and right is not None:
                ranked.append((-score, left[0], right[0], piece[:cut], piece[cut:]))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _byte_level_bpe(metadata: TokenizerMetadata, vocab: dict[str, int]) -> HFTokenizer:
    pre = metadata.pre_tokenizer
    merges = _split_merges(metadata.merges)
    hf = HFTokenizer(models.BPE(vocab, merges, ignore_merges=pre in _BPE_IGNORE_MERGES))
    if pre in _BPE_NFC:
        hf.normalizer = normalizers.NFC()
    splits = [pre_tokenizers.Split(Regex(r), "isolated") for r in _BPE_SPLITS[pre]]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    hf.decoder = decoders.ByteLevel()
    return hf


def _piece_bpe(
    metadata: TokenizerMetadata, vocab: dict[str, int], merges: list[tuple[str, str]]
) -> HFTokenizer:
    """BPE over SentencePiece-style pieces: a char that is no piece becomes its <0xNN> bytes."""
    unk = None if metadata.unk_id is None else metadata.tokens[metadata.unk_id]
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    spaces = [normalizers.Replace(" ", SPACE)]
    prefix = [normalizers.Prepend(SPACE)] if metadata.add_space_prefix else []
    hf.normalizer = normalizers.Sequence(prefix + spaces)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if metadata.add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))  # the space the prefix added
    hf.decoder = decoders.Sequence(steps)
    return hf


def _sentencepiece(metadata: TokenizerMetadata, vocab: dict[str, int]) -> HFTokenizer:
    return _piece_bpe(metadata, vocab, _sentencepiece_merges(metadata))


def _gemma4_bpe(metadata: TokenizerMetadata, vocab: dict[str, int]) -> HFTokenizer:
    hf = _piece_bpe(metadata, vocab, _split_merges(metadata.merges))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), "isolated")
    return hf


# tokenizer.ggml.model -> its builder (keys: GGUF_MODELS)
_GGUF_BUILDERS: Final = {"gpt2": _byte_level_bpe, "llama": _sentencepiece, "gemma4": _gemma4_bpe}


def _from_gguf(metadata: TokenizerMetadata) -> HFTokenizer:
    """The tokenizer of a GGUF vocabulary (see the module docstring)."""
    vocab = {text: i for i, text in enumerate(metadata.tokens)}
    hf = _GGUF_BUILDERS[metadata.model](metadata, vocab)
    _add_special_tokens(hf, metadata)
    return hf


def _add_special_tokens(hf: HFTokenizer, metadata: TokenizerMetadata) -> None:
    """Control tokens written in the text are matched whole, before anything else, as llama.cpp
    does with parse_special; user-defined tokens too, but they decode as text."""
    rstrip = set(metadata.rstrip_ids)
    specials, users = [], []
    for i, (text, kind) in enumerate(zip(metadata.tokens, metadata.token_types, strict=True)):
        if kind in (CONTROL, UNKNOWN):
            specials.append(AddedToken(text, special=True, normalized=False, rstrip=i in rstrip))
        elif kind == USER_DEFINED:
            users.append(AddedToken(text, normalized=False, rstrip=i in rstrip))
    hf.add_special_tokens(specials)
    hf.add_tokens(users)


def _from_tokenizer_json(text: str) -> HFTokenizer:
    try:
        return HFTokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for what it cannot read
        raise ValueError(f"tokenizer.json is not a tokenizer this server reads: {e}") from e


class Tokenizer:
    """The model's tokenizer: special tokens written in the text are parsed as special tokens."""

    def __init__(self, metadata: TokenizerMetadata) -> None:
        self.hf = (
            _from_gguf(metadata)
            if metadata.tokenizer_json is None
            else _from_tokenizer_json(metadata.tokenizer_json)
        )
        self.eos_ids = list(metadata.eos_ids)
        self.bos_id = metadata.bos_id
        self.bos_token = metadata.bos_token
        self.eos_token = metadata.eos_token
        self._first = metadata.bos_id if metadata.add_bos else None
        self._last = metadata.eos_id if metadata.add_eos else None
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self._alphabet = _byte_level_alphabet() if metadata.byte_level else None
        self._added = {i: t.content for i, t in self.hf.get_added_tokens_decoder().items()}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; add_special_tokens adds BOS first and EOS last where the model
        asks for them (add_bos, add_eos), unless the text already has it there."""
        # tokenizer.json post-processors are bypassed so GGUF and HF models behave alike
        ids: list[int] = self.hf.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self._first is not None and ids[:1] != [self._first]:
                ids.insert(0, self._first)
            if self._last is not None and ids[-1:] != [self._last]:
                ids.append(self._last)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ids (lossless for byte-level vocabularies when special tokens are kept)."""
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id ("Ġhello", "▁hello", "<0x0A>"), None if out of range."""
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
        if self._alphabet is not None and all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback is not None:
            return bytes([int(fallback[1], 16)])
        return piece.replace(SPACE, " ").encode()

    def vocabulary(self) -> list[bytes]:
        """The raw bytes of every token id, 0 .. vocab_size - 1 (for grammar masks)."""
        return [self.token_bytes(i) for i in range(self.vocab_size)]

    def new_decode_stream(self, skip_special_tokens: bool) -> decoders.DecodeStream:
        """A fresh incremental decoder; feed it with `stream.step(tokenizer.hf, token_id)`."""
        return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

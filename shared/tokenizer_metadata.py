"""What a model tells the server about its text: vocabulary, special tokens and chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

from shared.eos import end_of_generation_ids
from shared.gguf_file import gguf_reader

# GGUF token types (llama.cpp's llama_token_type)
NORMAL = 1
CONTROL = 3
USER_DEFINED = 4
UNUSED = 5


class TokenizerMetadata(msgspec.Struct, frozen=True):
    """The tokenizer and chat-format facts of one model, from a .gguf file or a HF directory."""

    tokens: list[str]  # token text by id
    token_types: list[int]  # GGUF token type by id (NORMAL, CONTROL, USER_DEFINED, ...)
    merges: list[str]  # BPE merges, "left right"
    pre_tokenizer: str  # GGUF tokenizer.ggml.pre ("smollm", "gpt2", ...); "hf" for tokenizer.json
    bos_id: int | None
    eos_ids: list[int]  # sorted, unique: every token that ends generation (shared/eos.py)
    chat_template: str | None
    add_bos: bool
    bos_token: str  # "" if none
    eos_token: str  # "" if none
    tokenizer_json: str | None  # raw tokenizer.json text (HF directories only)


def read_tokenizer_metadata(path: Path) -> TokenizerMetadata:
    """Read the tokenizer metadata of a .gguf file or a Hugging Face model directory."""
    if path.is_dir():
        return _read_hf_dir(path)
    if path.suffix == ".gguf" and path.is_file():
        return _read_gguf(path)
    raise ValueError(f"{path}: not a .gguf file or a model directory")


def _end_of_generation(tokens: list[str], token_types: list[int], ids: set[int]) -> list[int]:
    specials = {
        i: t for i, (t, k) in enumerate(zip(tokens, token_types, strict=True)) if k == CONTROL
    }
    return end_of_generation_ids(ids, specials)


def _checked_id(path: Path, key: str, value: int, num_tokens: int) -> int:
    if not 0 <= value < num_tokens:
        raise ValueError(f"{path}: {key} = {value} is outside the vocabulary (0..{num_tokens - 1})")
    return value


# --- GGUF ---------------------------------------------------------------------------------


def _read_gguf(path: Path) -> TokenizerMetadata:
    reader = gguf_reader(path)

    def field(key: str, required: bool = True) -> Any:
        f = reader.fields.get(key)
        if f is None:
            if required:
                raise ValueError(f"{path}: GGUF metadata has no {key}")
            return None
        try:
            return f.contents()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: GGUF metadata {key} is not valid UTF-8") from e

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model = {model!r}; only 'gpt2' (byte-level BPE) is supported"
        )
    num = len(tokens := field("tokenizer.ggml.tokens"))
    token_types: list[int] = field("tokenizer.ggml.token_type", required=False) or [NORMAL] * num
    if len(token_types) != num:
        raise ValueError(f"{path}: {len(token_types)} token types for {num} tokens")
    merges: list[str] = field("tokenizer.ggml.merges", required=False) or []
    if any(len(m.split(" ")) != 2 for m in merges):
        raise ValueError(f"{path}: tokenizer.ggml.merges holds an entry that is not 'a b'")

    def token_id(key: str) -> int | None:
        value = field(key, required=False)
        return None if value is None else _checked_id(path, key, int(value), num)

    bos_id = token_id("tokenizer.ggml.bos_token_id")
    eos_id = token_id("tokenizer.ggml.eos_token_id")
    ends = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    named = {eos_id, *(token_id(key) for key in ends)}
    eos_ids = _end_of_generation(tokens, token_types, {i for i in named if i is not None})
    eos_id = eos_ids[0] if eos_id is None and eos_ids else eos_id
    return TokenizerMetadata(
        tokens=tokens,
        token_types=[int(t) for t in token_types],
        merges=merges,
        pre_tokenizer=field("tokenizer.ggml.pre", required=False) or "default",
        bos_id=bos_id,
        eos_ids=eos_ids,
        chat_template=field("tokenizer.chat_template", required=False),
        add_bos=bool(field("tokenizer.ggml.add_bos_token", required=False)),
        bos_token="" if bos_id is None else tokens[bos_id],
        eos_token="" if eos_id is None else tokens[eos_id],
        tokenizer_json=None,
    )


# --- Hugging Face directory -----------------------------------------------------------------


class _AddedToken(msgspec.Struct):
    content: str
    special: bool = False
    id: int | None = None


class _TokenizerModel(msgspec.Struct):
    vocab: dict[str, int] | list[tuple[str, float]] = {}
    merges: list[str | tuple[str, str]] = []


class _TokenizerJson(msgspec.Struct):
    model: _TokenizerModel
    added_tokens: list[_AddedToken] = []
    post_processor: dict[str, Any] | None = None


class _NamedTemplate(msgspec.Struct):
    name: str
    template: str


class _TokenizerConfig(msgspec.Struct):
    chat_template: str | list[_NamedTemplate] | None = None
    bos_token: str | _AddedToken | None = None
    eos_token: str | _AddedToken | None = None
    add_bos_token: bool | None = None
    added_tokens_decoder: dict[str, _AddedToken] = {}


class _GenerationConfig(msgspec.Struct):
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    chat_template: str | None = None


T = TypeVar("T")


def _decode(path: Path, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as e:
        raise ValueError(f"{path}: {e}") from e


def _optional(path: Path, kind: type[T]) -> T:
    return _decode(path, kind) if path.is_file() else kind()


def _token_text(token: str | _AddedToken | None) -> str:
    return token.content if isinstance(token, _AddedToken) else (token or "")


def _template(config: _TokenizerConfig) -> str | None:
    if isinstance(config.chat_template, list):
        named = {t.name: t.template for t in config.chat_template}
        return named.get("default")
    return config.chat_template


def _as_ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else value


def _adds_bos(doc: _TokenizerJson, bos_token: str) -> bool:
    """Whether tokenizer.json's post-processor puts the BOS token first in a single sequence."""
    processor = doc.post_processor or {}
    # a Sequence (e.g. [ByteLevel, TemplateProcessing]) adds BOS if any member does
    members = processor.get("processors") if processor.get("type") == "Sequence" else [processor]
    singles = [m.get("single") for m in members or [] if isinstance(m, dict)]
    firsts = [s[0] for s in singles if isinstance(s, list) and s and isinstance(s[0], dict)]
    return any(f.get("SpecialToken", {}).get("id") == bos_token for f in firsts if bos_token)


def _vocabulary(
    tokenizer_path: Path, doc: _TokenizerJson, config_path: Path, config: _TokenizerConfig
) -> tuple[list[str], list[int]]:
    """Token text and type by id: the model's vocabulary plus the added tokens."""
    vocab = doc.model.vocab
    if isinstance(vocab, list):
        by_id = dict(enumerate(t for t, _ in vocab))
    else:
        by_id = {i: t for t, i in vocab.items()}
    kinds = dict.fromkeys(by_id, NORMAL)
    for added in doc.added_tokens:
        if added.id is None:
            raise ValueError(f"{tokenizer_path}: added token {added.content!r} has no id")
        by_id[added.id] = added.content
        kinds[added.id] = CONTROL if added.special else USER_DEFINED
    for key, added in config.added_tokens_decoder.items():
        if not key.isdigit() or by_id.get(int(key)) != added.content:
            raise ValueError(
                f"{config_path}: added token {key} = {added.content!r} is not in tokenizer.json"
            )
        kinds[int(key)] = CONTROL if added.special else USER_DEFINED
    if not by_id or min(by_id) < 0:
        raise ValueError(f"{tokenizer_path}: empty vocabulary or negative token id")
    num = max(by_id) + 1
    return [by_id.get(i, "") for i in range(num)], [kinds.get(i, UNUSED) for i in range(num)]


def _read_hf_dir(path: Path) -> TokenizerMetadata:
    tokenizer_path = path / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ValueError(f"{tokenizer_path}: missing (a model directory needs a tokenizer.json)")
    tokenizer_json = tokenizer_path.read_text(encoding="utf-8")
    doc = _decode(tokenizer_path, _TokenizerJson)
    tok_config_path = path / "tokenizer_config.json"
    tok_config = _optional(tok_config_path, _TokenizerConfig)
    gen_config_path = path / "generation_config.json"
    gen_config = _optional(gen_config_path, _GenerationConfig)
    model_config_path = path / "config.json"
    model_config = _optional(model_config_path, _GenerationConfig)
    tokens, token_types = _vocabulary(tokenizer_path, doc, tok_config_path, tok_config)
    num = len(tokens)
    ids = {t: i for i, t in enumerate(tokens) if t}

    def special_id(token: str | _AddedToken | None) -> int | None:
        text = _token_text(token)
        if text and text not in ids:
            raise ValueError(f"{tok_config_path}: special token {text!r} is not in the vocabulary")
        return ids.get(text)

    named: list[int] = []
    for source, config in ((gen_config_path, gen_config), (model_config_path, model_config)):
        named += [_checked_id(source, "eos_token_id", i, num) for i in _as_ids(config.eos_token_id)]
        if config.bos_token_id is not None:
            _checked_id(source, "bos_token_id", config.bos_token_id, num)
    bos_id = special_id(tok_config.bos_token)
    if bos_id is None:
        bos_id = (
            gen_config.bos_token_id
            if gen_config.bos_token_id is not None
            else model_config.bos_token_id
        )
    eos_id = special_id(tok_config.eos_token)
    if eos_id is None and named:
        eos_id = named[0]
    eos_ids = _end_of_generation(
        tokens, token_types, {*named, *([] if eos_id is None else [eos_id])}
    )
    bos_token = "" if bos_id is None else tokens[bos_id]

    # generation_config.json's template wins over the tokenizer's
    chat_template = gen_config.chat_template or _template(tok_config)
    jinja_path = path / "chat_template.jinja"
    if chat_template is None and jinja_path.is_file():
        chat_template = jinja_path.read_text(encoding="utf-8")
    add_bos = tok_config.add_bos_token
    return TokenizerMetadata(
        tokens=tokens,
        token_types=token_types,
        merges=[m if isinstance(m, str) else " ".join(m) for m in doc.model.merges],
        pre_tokenizer="hf",
        bos_id=bos_id,
        eos_ids=eos_ids,
        chat_template=chat_template,
        add_bos=_adds_bos(doc, bos_token) if add_bos is None else add_bos,
        bos_token=bos_token,
        eos_token="" if eos_id is None else tokens[eos_id],
        tokenizer_json=tokenizer_json,
    )

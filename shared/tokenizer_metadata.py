"""What a model tells the server about its text: vocabulary, special tokens and chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from shared.eos import end_of_generation_ids
from shared.gguf_file import gguf_reader

# GGUF token types (llama.cpp's llama_token_type)
NORMAL = 1
UNKNOWN = 2
CONTROL = 3
USER_DEFINED = 4
UNUSED = 5
BYTE = 6  # SentencePiece's byte-fallback pieces, <0x00> .. <0xFF>

# tokenizer.ggml.model values served: byte-level BPE, SentencePiece with byte fallback, and
# Gemma 4's BPE over SentencePiece-style pieces; "hf" stands for a tokenizer.json
GGUF_MODELS: Final = ("gpt2", "llama", "gemma4")
# tokenizer.ggml.pre values served for a "gpt2" vocabulary (each names its split rule)
BPE_PRE_TOKENIZERS: Final = ("default", "gpt-2", "smollm", "llama-bpe", "qwen2", "qwen35")
# llama.cpp gives these chat-marker tokens of a Phi-3 vocabulary (by its general.name) an
# rstrip: whitespace after one is part of it. tokenizer.json says so too; GGUF cannot.
_PHI3_NAMES: Final = ("phi-3", "phi3")
_PHI3_NO_RSTRIP: Final = frozenset({"<unk>", "<s>", "<|endoftext|>"})


class TokenizerMetadata(msgspec.Struct, frozen=True):
    """The tokenizer and chat-format facts of one model, from a .gguf file or a HF directory."""

    model: str  # GGUF tokenizer.ggml.model (one of GGUF_MODELS), or "hf" for tokenizer.json
    tokens: list[str]  # token text by id
    token_types: list[int]  # GGUF token type by id (NORMAL, CONTROL, USER_DEFINED, ...)
    scores: list[float]  # SentencePiece piece scores by id ("llama" vocabularies), else []
    merges: list[str]  # BPE merges, "left right"
    pre_tokenizer: str  # GGUF tokenizer.ggml.pre ("smollm", "llama-bpe", ...); "hf": tokenizer.json
    byte_level: bool  # token text in GPT-2's byte alphabet; else SentencePiece text (▁ = space)
    add_space_prefix: bool  # SentencePiece: a space starts the text and each text after a special
    bos_id: int | None
    eos_id: int | None  # the token add_eos appends
    unk_id: int | None
    eos_ids: list[int]  # sorted, unique: every token that ends generation (shared/eos.py)
    rstrip_ids: list[int]  # special tokens that take the whitespace after them
    chat_template: str | None
    tool_use_template: str | None  # the template to render with when a request has tools
    add_bos: bool  # encoding with special tokens prepends BOS
    add_eos: bool  # ... and appends EOS
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
    kinds = (CONTROL, USER_DEFINED)
    specials = {
        i: t for i, (t, k) in enumerate(zip(tokens, token_types, strict=True)) if k in kinds
    }
    return end_of_generation_ids(ids, specials)


def _checked_id(path: Path, key: str, value: int, num_tokens: int) -> int:
    if not 0 <= value < num_tokens:
        raise ValueError(f"{path}: {key} = {value} is outside the vocabulary (0..{num_tokens - 1})")
    return value


# --- GGUF ---------------------------------------------------------------------------------


def _served_vocabulary(path: Path, model: object, pre: str) -> str:
    """The tokenizer.ggml.model, if this server tokenizes it (with this pre-tokenizer)."""
    if model not in GGUF_MODELS:
        raise ValueError(
            f"{path}: tokenizer.ggml.model = {model!r} is not served (served: 'gpt2', byte-level"
            " BPE; 'llama', SentencePiece; 'gemma4')"
        )
    if model == "gpt2" and pre not in BPE_PRE_TOKENIZERS:
        served = ", ".join(repr(p) for p in BPE_PRE_TOKENIZERS)
        raise ValueError(
            f"{path}: tokenizer.ggml.pre = {pre!r} is a pre-tokenizer this server does not"
            f" know; its ids would be wrong (served: {served})"
        )
    return str(model)


def _phi3_rstrip_ids(name: str, tokens: list[str], token_types: list[int]) -> list[int]:
    if not any(n in name.lower() for n in _PHI3_NAMES):
        return []
    kinds = (CONTROL, USER_DEFINED, UNKNOWN)
    pairs = zip(tokens, token_types, strict=True)
    return [
        i
        for i, (t, k) in enumerate(pairs)
        if (k in kinds and t not in _PHI3_NO_RSTRIP) or t == "</s>"
    ]


def _read_gguf(path: Path) -> TokenizerMetadata:
    reader = gguf_reader(path)

    def field(key: str, kind: Any, required: bool = True) -> Any:
        value = reader.value(key, kind=kind)
        if value is None and required:
            raise ValueError(f"{path}: GGUF metadata has no {key}")
        return value

    pre = field("tokenizer.ggml.pre", str, required=False) or "default"
    model = _served_vocabulary(path, field("tokenizer.ggml.model", object), pre)
    num = len(tokens := field("tokenizer.ggml.tokens", list[str]))
    token_types: list[int] = (
        field("tokenizer.ggml.token_type", list[int], required=False) or [NORMAL] * num
    )
    if len(token_types) != num:
        raise ValueError(f"{path}: {len(token_types)} token types for {num} tokens")
    scores: list[float] = field("tokenizer.ggml.scores", list[float], required=False) or []
    if model == "llama" and len(scores) != num:
        raise ValueError(f"{path}: {len(scores)} token scores for {num} SentencePiece tokens")
    merges: list[str] = field("tokenizer.ggml.merges", list[str], required=False) or []
    if any(m.find(" ", 1) < 0 for m in merges):
        raise ValueError(f"{path}: tokenizer.ggml.merges holds an entry that is not 'a b'")

    def token_id(key: str) -> int | None:
        value = field(key, int, required=False)
        return None if value is None else _checked_id(path, key, value, num)

    def flag(key: str, default: bool) -> bool:
        value = field(key, bool, required=False)
        return default if value is None else value

    bos_id = token_id("tokenizer.ggml.bos_token_id")
    eos_id = token_id("tokenizer.ggml.eos_token_id")
    ends = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    named = {eos_id, *(token_id(key) for key in ends)}
    eos_ids = _end_of_generation(tokens, token_types, {i for i in named if i is not None})
    eos_id = eos_ids[0] if eos_id is None and eos_ids else eos_id
    # llama.cpp's defaults where the file says nothing: SentencePiece and Llama 3 vocabularies
    # start with BOS; Gemma 4 always does (its files may say false)
    adds_bos = model != "gpt2" or pre == "llama-bpe"
    return TokenizerMetadata(
        model=model,
        tokens=tokens,
        token_types=token_types,
        scores=scores,
        merges=merges,
        pre_tokenizer=pre,
        byte_level=model == "gpt2",
        add_space_prefix=flag("tokenizer.ggml.add_space_prefix", model == "llama"),
        bos_id=bos_id,
        eos_id=eos_id,
        unk_id=token_id("tokenizer.ggml.unknown_token_id"),
        eos_ids=eos_ids,
        rstrip_ids=_phi3_rstrip_ids(field("general.name", str, False) or "", tokens, token_types),
        chat_template=field("tokenizer.chat_template", str, required=False),
        tool_use_template=field("tokenizer.chat_template.tool_use", str, required=False),
        add_bos=model == "gemma4" or flag("tokenizer.ggml.add_bos_token", adds_bos),
        add_eos=flag("tokenizer.ggml.add_eos_token", False),
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
    decoder: dict[str, Any] | None = None


class _NamedTemplate(msgspec.Struct):
    name: str
    template: str


class _TokenizerConfig(msgspec.Struct):
    chat_template: str | list[_NamedTemplate] | None = None
    bos_token: str | _AddedToken | None = None
    eos_token: str | _AddedToken | None = None
    unk_token: str | _AddedToken | None = None
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
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


def _templates(config: _TokenizerConfig) -> tuple[str | None, str | None]:
    """The default chat template and the one for requests with tools (None: the default)."""
    if isinstance(config.chat_template, list):
        named = {t.name: t.template for t in config.chat_template}
        return named.get("default"), named.get("tool_use")
    return config.chat_template, None


def _as_ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else value


def _members(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A tokenizer.json component, or the members of its Sequence."""
    node = node or {}
    members = node.get(key) if node.get("type") == "Sequence" else [node]
    return [m for m in members or [] if isinstance(m, dict)]


def _post_processor_adds(doc: _TokenizerJson, token: str, end: int) -> bool:
    """Whether tokenizer.json's post-processor puts `token` first (end 0) or last (end -1) in
    a single sequence (a Sequence, e.g. [ByteLevel, TemplateProcessing], if any member does)."""
    singles = [m.get("single") for m in _members(doc.post_processor, "processors")]
    ends = [s[end] for s in singles if isinstance(s, list) and s and isinstance(s[end], dict)]
    return any(e.get("SpecialToken", {}).get("id") == token for e in ends if token)


def _byte_level_decoder(doc: _TokenizerJson) -> bool:
    return any(m.get("type") == "ByteLevel" for m in _members(doc.decoder, "decoders"))


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
    eos_token = "" if eos_id is None else tokens[eos_id]

    # generation_config.json's template wins over the tokenizer's
    chat_template, tool_use_template = _templates(tok_config)
    chat_template = gen_config.chat_template or chat_template
    jinja_path = path / "chat_template.jinja"
    if chat_template is None and jinja_path.is_file():
        chat_template = jinja_path.read_text(encoding="utf-8")
    add_bos, add_eos = tok_config.add_bos_token, tok_config.add_eos_token
    return TokenizerMetadata(
        model="hf",
        tokens=tokens,
        token_types=token_types,
        scores=[],
        merges=[m if isinstance(m, str) else " ".join(m) for m in doc.model.merges],
        pre_tokenizer="hf",
        byte_level=_byte_level_decoder(doc),
        add_space_prefix=False,  # tokenizer.json's normalizer says so itself
        bos_id=bos_id,
        eos_id=eos_id,
        unk_id=special_id(tok_config.unk_token),
        eos_ids=eos_ids,
        rstrip_ids=[],  # tokenizer.json's added tokens carry their own
        chat_template=chat_template,
        tool_use_template=tool_use_template,
        add_bos=_post_processor_adds(doc, bos_token, 0) if add_bos is None else add_bos,
        add_eos=_post_processor_adds(doc, eos_token, -1) if add_eos is None else add_eos,
        bos_token=bos_token,
        eos_token=eos_token,
        tokenizer_json=tokenizer_json,
    )

"""Tokenizer: SmolLM2's GGUF against llama.cpp's reference ids, the tiny byte tokenizer, and
the raw bytes of every token id (the other GGUF vocabularies: test_tokenizer_rules.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import CONTROL, NORMAL, read_tokenizer_metadata
from tests.conftest import missing_bundled_model
from tests.fixtures.byte_tokenizer import byte_tokenizer_json, byte_unicode_chars

SMOLLM_GGUF = Path.home() / ".cache/tl-serve/SmolLM2-135M-Instruct.Q4_1.gguf"
CASES = Path(__file__).resolve().parents[1] / "data" / "tokenize_cases.json"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    if not SMOLLM_GGUF.is_file():
        missing_bundled_model(SMOLLM_GGUF)
    return Tokenizer(read_tokenizer_metadata(SMOLLM_GGUF))


def reference_cases() -> list[dict[str, object]]:
    if not CASES.is_file():
        return []
    cases: list[dict[str, object]] = json.loads(CASES.read_text())["cases"]
    return cases


def test_reference_file_has_cases() -> None:
    assert len(reference_cases()) >= 150


@pytest.mark.parametrize("case", reference_cases(), ids=lambda c: repr(c["text"])[:40])
def test_smollm_matches_llama_cpp_ids(smollm: Tokenizer, case: dict[str, object]) -> None:
    text = case["text"]
    assert isinstance(text, str)
    ids = smollm.encode(text)
    assert ids == case["ids"]
    assert smollm.decode(ids) == text


def test_smollm_special_tokens(smollm: Tokenizer) -> None:
    ids = smollm.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1
    assert ids[-2:] == [2, 198]
    assert smollm.decode(ids, skip_special_tokens=True) == "user\nHi\n"
    # a control token's text is only special whole: a broken one is ordinary text
    assert 1 not in smollm.encode("<|im_start |>")
    assert smollm.eos_ids == [0, 2]
    assert (smollm.bos_token, smollm.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smollm.vocab_size == 49152
    assert smollm.id_to_token(28120) == "hello"
    assert smollm.token_to_id("Ġhello") == 33662
    assert smollm.token_to_id("no such token") is None
    # the GGUF says add_bos_token = false
    assert smollm.encode("hello", add_special_tokens=True) == [28120]


def test_smollm_digits_are_split(smollm: Tokenizer) -> None:
    ids = smollm.encode("12345")
    assert [smollm.id_to_token(i) for i in ids] == list("12345")


@pytest.mark.parametrize(
    "text", ["hello world", "héllo wörld 😀 ok", "日本語のテキスト", " a\n\tb"]
)
def test_smollm_token_bytes_concatenate_to_the_utf8_text(smollm: Tokenizer, text: str) -> None:
    # a token may hold part of a character: only the concatenation is valid UTF-8
    assert b"".join(smollm.token_bytes(i) for i in smollm.encode(text)) == text.encode()


def test_smollm_vocabulary_is_the_bytes_of_every_id(smollm: Tokenizer) -> None:
    vocabulary = smollm.vocabulary()
    assert len(vocabulary) == smollm.vocab_size
    assert vocabulary[33662] == smollm.token_bytes(33662) == b" hello"
    assert vocabulary[2] == b"<|im_end|>"  # a special token is its text
    assert smollm.token_bytes(smollm.vocab_size) == b""  # past the vocabulary


def stream_text(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    stream = tokenizer.new_decode_stream(skip_special_tokens)
    pieces = [stream.step(tokenizer.hf, i) for i in ids]
    return "".join(p for p in pieces if p is not None)


@pytest.mark.parametrize(
    "text", ["héllo wörld 😀 ok", "日本語のテキスト", " a  b\n\nc", "x<|im_end|>y"]
)
def test_smollm_decode_stream_concatenates_to_decode(smollm: Tokenizer, text: str) -> None:
    ids = smollm.encode(text)
    assert stream_text(smollm, ids, skip_special_tokens=False) == text
    assert stream_text(smollm, ids, skip_special_tokens=True) == text.replace("<|im_end|>", "")


def byte_dir(tmp_path: Path, config: dict[str, object] | None = None) -> Path:
    root = tmp_path / "byte"
    root.mkdir()
    (root / "tokenizer.json").write_text(byte_tokenizer_json(SPECIALS))
    if config is not None:
        (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def test_byte_tokenizer_ids_are_byte_values(tmp_path: Path) -> None:
    tok = Tokenizer(read_tokenizer_metadata(byte_dir(tmp_path)))
    assert tok.encode("a") == [97]
    text = "Hi é\n\t😀 \x00"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(list(text.encode("utf-8"))) == text
    assert tok.vocab_size == 256 + len(SPECIALS)


def test_byte_tokenizer_specials(tmp_path: Path) -> None:
    tok = Tokenizer(read_tokenizer_metadata(byte_dir(tmp_path)))
    ids = tok.encode("<|im_start|>ab<|im_end|><|endoftext|>")
    assert ids == [256, 97, 98, 257, 258]
    assert tok.decode(ids) == "<|im_start|>ab<|im_end|><|endoftext|>"
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.eos_ids == [257, 258]
    assert stream_text(tok, [*"é".encode(), 257], skip_special_tokens=False) == "é<|im_end|>"


def test_byte_tokenizer_vocabulary(tmp_path: Path) -> None:
    tok = Tokenizer(read_tokenizer_metadata(byte_dir(tmp_path)))
    assert tok.vocabulary() == [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIALS]


def test_byte_tokenizer_adds_bos_only_when_asked(tmp_path: Path) -> None:
    root = byte_dir(tmp_path, {"bos_token": "<|im_start|>", "add_bos_token": True})
    tok = Tokenizer(read_tokenizer_metadata(root))
    assert tok.encode("a") == [97]
    assert tok.encode("a", add_special_tokens=True) == [256, 97]
    assert tok.encode("", add_special_tokens=True) == [256]
    # a prompt that already starts with BOS (a template wrote it) does not get a second one
    assert tok.encode("<|im_start|>a", add_special_tokens=True) == [256, 97]


def write_byte_gguf(path: Path) -> Path:
    """The tiny GGUF models' layout: byte-level chars in byte order, no merges, control specials."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(byte_unicode_chars() + SPECIALS)
    w.add_token_types([NORMAL] * 256 + [CONTROL] * len(SPECIALS))
    w.add_token_merges([])
    w.add_eos_token_id(257)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_byte_tokenizer_from_gguf_metadata(tmp_path: Path) -> None:
    tok = Tokenizer(read_tokenizer_metadata(write_byte_gguf(tmp_path / "byte.gguf")))
    text = "a b<|im_end|>ü 12"
    ids = tok.encode(text)
    assert ids == [97, 32, 98, 257, *"ü".encode(), 32, 49, 50]
    assert tok.decode(ids) == text
    assert tok.eos_ids == [257, 258]

"""The GGUF tokenizer rules on small hand-made vocabularies, ids worked out by hand: SentencePiece
merges by score, byte fallback, the space prefix, Gemma 4's BPE, the pre-tokenizer splits,
BOS/EOS, Phi-3's rstrip, and the refusal of vocabularies this server does not know.

(The real vocabularies of each family, against their tokenizers' ids: test_vocabularies.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import (
    BPE_PRE_TOKENIZERS,
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    read_tokenizer_metadata,
)
from tests.fixtures.byte_tokenizer import byte_unicode_chars
from tests.fixtures.vocab_gguf import write_vocab_gguf as write

BYTES = [f"<0x{b:02X}>" for b in range(256)]
# SentencePiece pieces and scores: higher merges first, so "ll" (-9) before "he" (-10)
PIECES = {"▁": -1, "h": -2, "e": -3, "l": -4, "o": -5, "w": -6, "ll": -9, "he": -10}
PIECES |= {"▁he": -11, "llo": -12, "▁hello": -13, "▁w": -14, "▁wo": -15}
SPM = ["<unk>", "<s>", "</s>", "<|end|>", "<tool>", *BYTES, *PIECES]
ID = {text: i for i, text in enumerate(SPM)}
FIRST_BYTE = ID["<0x00>"]


def spm(tmp_path: Path, **meta: object) -> Tokenizer:
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, USER_DEFINED] + [BYTE] * 256
    types += [NORMAL] * len(PIECES)
    scores = [0.0] * (5 + 256) + [float(s) for s in PIECES.values()]
    ids = {"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}
    # a new file each time: the parsed GGUF is cached by path
    name = f"spm-{len(list(tmp_path.iterdir()))}.gguf"
    path = write(tmp_path / name, "llama", SPM, types, scores=scores, **(ids | meta))
    return Tokenizer(read_tokenizer_metadata(path))


def pieces(tok: Tokenizer, text: str, add_special_tokens: bool = False) -> list[str]:
    return [tok.id_to_token(i) or "" for i in tok.encode(text, add_special_tokens)]


def test_sentencepiece_merges_by_score_with_a_space_prefix(tmp_path: Path) -> None:
    tok = spm(tmp_path)
    # ▁ h e l l o: "ll" (-9), then "he", "▁he", "llo", "▁hello"; w o: "▁w", "▁wo"
    assert pieces(tok, "hello") == ["▁hello"]
    assert pieces(tok, "hello wo") == ["▁hello", "▁wo"]
    assert pieces(tok, "ohell") == ["▁", "o", "he", "ll"]
    # every text after a special token starts with a space too
    assert pieces(tok, "<|end|>hello") == ["<|end|>", "▁hello"]
    assert tok.encode("") == []


def test_sentencepiece_byte_fallback_and_decoding(tmp_path: Path) -> None:
    tok = spm(tmp_path)
    # é is no piece: its UTF-8 bytes are
    ids = tok.encode("hé")
    assert ids == [ID["▁"], ID["h"], FIRST_BYTE + 0xC3, FIRST_BYTE + 0xA9]
    assert tok.decode(ids) == "hé"  # the space prefix is dropped again
    assert tok.decode([ID["<s>"], ID["▁hello"], ID["▁wo"]]) == "<s> hello wo"
    assert tok.decode([ID["<s>"], ID["▁hello"]], skip_special_tokens=True) == "hello"
    assert tok.token_bytes(ID["▁hello"]) == b" hello"
    assert tok.token_bytes(FIRST_BYTE + 0x0A) == b"\n"
    assert tok.token_bytes(ID["<|end|>"]) == b"<|end|>"
    # a user-defined token is matched whole and decodes as text
    assert pieces(tok, "<tool>hello") == ["<tool>", "▁hello"]
    assert tok.decode(tok.encode("<tool>"), skip_special_tokens=True) == "<tool>"


def test_sentencepiece_without_space_prefix_gemma_2_and_3(tmp_path: Path) -> None:
    tok = spm(tmp_path, add_space_prefix=False)
    assert pieces(tok, "hello") == ["he", "llo"]
    assert pieces(tok, " hello") == ["▁hello"]
    assert tok.decode(tok.encode(" hello")) == " hello"


def test_sentencepiece_adds_bos_unless_the_file_says_not(tmp_path: Path) -> None:
    assert spm(tmp_path).encode("hello", add_special_tokens=True) == [1, ID["▁hello"]]
    # the text starts with BOS already (a chat template wrote it): no second one
    assert spm(tmp_path).encode("<s>hello", add_special_tokens=True) == [1, ID["▁hello"]]
    assert spm(tmp_path).encode("hello") == [ID["▁hello"]]
    no_bos = spm(tmp_path, add_bos_token=False, add_eos_token=True)
    assert no_bos.encode("hello", add_special_tokens=True) == [ID["▁hello"], 2]
    assert no_bos.encode("hello</s>", add_special_tokens=True) == [ID["▁hello"], 2]


def test_phi3_special_tokens_take_the_whitespace_after_them(tmp_path: Path) -> None:
    phi3 = spm(tmp_path, **{"general.name": "Phi3"})
    assert pieces(phi3, "<|end|>\n hello") == ["<|end|>", "▁hello"]
    assert pieces(phi3, "<s> hello") == ["<s>", "▁", "▁hello"]  # except BOS (and <unk>, EOS)
    assert pieces(spm(tmp_path), "<|end|>\nhello") == ["<|end|>", "▁", "<0x0A>", "he", "llo"]


GEMMA4 = ["<pad>", "<eos>", "<bos>", "<unk>", "<turn|>", *BYTES, "▁", "a", "b", "\n"]
GEMMA4 += ["ab", "▁ab", "\n\n"]


def gemma4(tmp_path: Path, **meta: object) -> Tokenizer:
    types = [CONTROL] * 5 + [BYTE] * 256 + [NORMAL] * (len(GEMMA4) - 261)
    merges = ["a b", "▁ ab", "\n \n"]
    ids = {"bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3}
    path = write(tmp_path / "g4.gguf", "gemma4", GEMMA4, types, merges=merges, **(ids | meta))
    return Tokenizer(read_tokenizer_metadata(path))


def test_gemma4_bpe_over_pieces_split_at_newlines(tmp_path: Path) -> None:
    tok = gemma4(tmp_path, add_bos_token=False)  # Gemma 4 starts with BOS whatever its file says
    g = {text: i for i, text in enumerate(GEMMA4)}
    # "▁ab▁ab" | "\n\n" | "ab": merges never cross a newline
    assert tok.encode(" ab ab\n\nab", add_special_tokens=True) == [
        2, g["▁ab"], g["▁ab"], g["\n\n"], g["ab"]
    ]  # fmt: skip
    assert tok.encode("aé") == [g["a"], g["<0xC3>"], g["<0xA9>"]]  # byte fallback
    assert tok.decode(tok.encode(" ab ab\n\nab")) == " ab ab\n\nab"
    assert tok.eos_ids == [1, 4]  # <eos> and Gemma 4's <turn|>


def bpe(tmp_path: Path, pre: str, extra: list[str], merges: list[str]) -> Tokenizer:
    tokens = byte_unicode_chars() + ["<|endoftext|>", *extra]
    types = [NORMAL] * 256 + [CONTROL] + [NORMAL] * len(extra)
    path = write(tmp_path / f"{pre}.gguf", "gpt2", tokens, types, pre=pre, merges=merges)
    return Tokenizer(read_tokenizer_metadata(path))


DIGITS, DIGIT_MERGES = ["12", "123", "1234"], ["1 2", "12 3", "123 4"]


@pytest.mark.parametrize(
    ("pre", "words"),
    [
        ("gpt-2", ["Ġ", "1234", "a", "+", "b"]),  # digit runs whole
        ("smollm", ["Ġ", "1", "2", "3", "4", "a", "+", "b"]),  # every digit alone
        ("llama-bpe", ["Ġ", "123", "4", "a", "+", "b"]),  # at most three digits
        ("qwen2", ["Ġ", "1", "2", "3", "4", "a", "+", "b"]),
        ("qwen35", ["Ġ", "1", "2", "3", "4", "a", "+", "b"]),
        ("default", ["Ġ", "123", "4", "a", "+", "b"]),  # llama.cpp's four regexes
    ],
)
def test_each_pre_tokenizer_splits_words_its_own_way(
    tmp_path: Path, pre: str, words: list[str]
) -> None:
    tok = bpe(tmp_path, pre, DIGITS, DIGIT_MERGES)
    assert [tok.id_to_token(i) for i in tok.encode(" 1234a+b")] == words
    assert tok.decode(tok.encode(" 1234a+b")) == " 1234a+b"


def test_every_served_pre_tokenizer_has_a_rule(tmp_path: Path) -> None:
    assert len(BPE_PRE_TOKENIZERS) == 6
    for pre in BPE_PRE_TOKENIZERS:
        assert bpe(tmp_path, pre, [], []).encode("ab") == [97, 98]


def test_qwen2_composes_characters_first(tmp_path: Path) -> None:
    composed = ["Ã", "©", "Ã©"]  # é (U+00E9) in GPT-2's byte alphabet: bytes C3 A9
    qwen2 = bpe(tmp_path, "qwen2", composed[2:], ["Ã ©"])
    assert qwen2.encode("e\u0301") == qwen2.encode("\u00e9") == [257]
    assert bpe(tmp_path, "qwen35", composed[2:], ["Ã ©"]).encode("e\u0301") == [101, 204, 129]


def test_llama3_takes_whole_words_from_the_vocabulary(tmp_path: Path) -> None:
    # no merge makes "abc", but the word is in the vocabulary: Llama 3's BPE takes it whole
    extra, merges = ["ab", "abc"], ["a b"]
    assert bpe(tmp_path, "llama-bpe", extra, merges).encode("abc") == [258]
    assert bpe(tmp_path, "gpt-2", extra, merges).encode("abc") == [257, 99]


@pytest.mark.parametrize(
    ("model", "pre", "message"),
    [
        ("bert", "default", "tokenizer.ggml.model = 'bert' is not served"),
        ("gpt2", "deepseek-coder", "tokenizer.ggml.pre = 'deepseek-coder' is a pre-tokenizer"),
        ("gpt2", "llama3", "'llama3' is a pre-tokenizer this server does not know"),
    ],
)
def test_unknown_vocabularies_are_refused_by_name(
    tmp_path: Path, model: str, pre: str, message: str
) -> None:
    path = write(tmp_path / "x.gguf", model, ["a"], [NORMAL], pre=pre, merges=[])
    with pytest.raises(ValueError, match=message) as info:
        read_tokenizer_metadata(path)
    assert str(path) in str(info.value)


def test_gguf_templates_default_and_tool_use(tmp_path: Path) -> None:
    templates = {"tokenizer.chat_template": "D", "tokenizer.chat_template.tool_use": "T"}
    path = write(tmp_path / "t.gguf", "gpt2", ["a"], [NORMAL], merges=[], **templates)
    metadata = read_tokenizer_metadata(path)
    assert (metadata.chat_template, metadata.tool_use_template) == ("D", "T")

"""Detokenizer over a byte-level fake tokenizer: whole characters only, nothing lost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontend.text.detokenizer import Detokenizer


def byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def stream(ids: list[int], group: int = 1, prompt_ids: list[int] | None = None) -> list[str]:
    detok = Detokenizer(byte_decode, prompt_ids or [])
    out = [detok.push(ids[i : i + group]) for i in range(0, len(ids), group)]
    out.append(detok.flush())
    return out


@pytest.mark.parametrize("text", ["é", "中", "😀", "aé中😀b", "naïve café", "ascii only"])
def test_multibyte_characters_come_out_whole(text: str) -> None:
    ids = list(text.encode())
    out = stream(ids)
    assert "".join(out) == text
    assert "\ufffd" not in "".join(out)
    # Each delta is either empty or one whole character, in order.
    assert [d for d in out if d] == list(text)


def test_held_until_the_character_completes() -> None:
    detok = Detokenizer(byte_decode)
    emoji = "😀".encode()
    assert [detok.push([b]) for b in emoji[:3]] == ["", "", ""]
    assert detok.push([emoji[3]]) == "😀"
    assert detok.flush() == ""


def test_flush_emits_an_incomplete_tail_as_replacement() -> None:
    detok = Detokenizer(byte_decode)
    assert detok.push(list(b"a\xe4\xb8")) == ""  # "a" + two bytes of 中 in one push
    assert detok.flush() == "a\ufffd"
    assert detok.flush() == ""


def test_invalid_byte_followed_by_text_is_emitted() -> None:
    out = stream(list(b"\xffab"))
    assert "".join(out) == "\ufffdab"
    assert out[0] == ""  # a lone invalid byte might still be an incomplete character


def test_prompt_context_is_not_repeated() -> None:
    out = stream(list(b"world"), prompt_ids=list(b"hello "))
    assert "".join(out) == "world"


def test_skipped_tokens_emit_nothing_and_lose_nothing() -> None:
    # A decode that skips "special" id 0, like skip_special_tokens=True.
    def decode(ids: list[int]) -> str:
        return byte_decode([i for i in ids if i != 0])

    detok = Detokenizer(decode)
    assert detok.push([0]) == ""
    assert detok.push([104, 0, 105]) == "hi"
    assert detok.flush() == ""


@given(
    text=st.text(max_size=40),
    group=st.integers(min_value=1, max_value=5),
    junk=st.binary(max_size=3),
)
def test_concatenation_equals_full_decode(text: str, group: int, junk: bytes) -> None:
    ids = list(text.encode() + junk)
    out = stream(ids, group=group)
    assert "".join(out) == byte_decode(ids)
    if not junk and "\ufffd" not in text:
        # Valid UTF-8 is never split: no delta carries a replacement character.
        assert not any("\ufffd" in d for d in out)

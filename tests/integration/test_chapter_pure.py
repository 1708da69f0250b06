"""The chapter's two pure tests: the chat template by hand, and the text stream byte by byte
(detokenizer + stop-string holdback, through frontend.text.generation.Generation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from frontend.text.chat_template import DEFAULT_TEMPLATE, ChatTemplate
from frontend.text.generation import Generation
from shared.config import BUNDLED_MODEL
from shared.protocol import FinishReason, TokenEvent
from shared.tokenizer_metadata import read_card
from tests.fixtures.byte_tokenizer import byte_tokenizer_json
from tests.fixtures.chat_templates import SMOLLM_TEMPLATE
from tests.fixtures.tiny_model import EOS, SPECIALS

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def smollm_templates() -> list[str]:
    """The chapter's literal, and the real one from the bundled GGUF's card when it is here."""
    templates = [SMOLLM_TEMPLATE]
    bundled = Path(BUNDLED_MODEL).expanduser()
    if bundled.exists():
        card_template = read_card(bundled).chat_template
        assert card_template is not None
        templates.append(card_template)
    return templates


def test_chat_template_hand_example() -> None:
    for source in smollm_templates():
        t = ChatTemplate(source, "<|im_start|>", "<|im_end|>")
        hi = [{"role": "user", "content": "Hi"}]
        # loop.first and messages[0] is not system: the default system turn, then the user's,
        # then the generation prompt
        assert t.render(hi, add_generation_prompt=True) == (
            SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        )
        assert (
            t.render(hi, add_generation_prompt=False) == SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"
        )
        turns = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
        assert t.render(turns, add_generation_prompt=True) == (
            SYSTEM
            + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            + "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        )  # the system turn once, at the top only
        own = [{"role": "system", "content": "Be terse."}, *hi]
        assert t.render(own, add_generation_prompt=True) == (
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    # filters, elif, loop.last, whitespace control
    mix = ChatTemplate(
        "{%- for m in messages -%}\n  {%- if m.role == 'user' -%} U"
        "{%- elif m.role == 'assistant' -%} A{%- else -%} S{%- endif -%}"
        ":{{ m.content | trim | upper }}{% if not loop.last %}|{% endif %}\n"
        "{%- endfor %}{{ bos_token }}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    three = [
        {"role": "system", "content": " x "},
        {"role": "user", "content": "hi "},
        {"role": "assistant", "content": "yo"},
    ]
    assert mix.render(three, add_generation_prompt=False) == "S:X|U:HI|A:YO<s></s>"
    # the default template, for models without one
    default = ChatTemplate(DEFAULT_TEMPLATE, "", "")
    assert default.render(three, add_generation_prompt=True) == (
        "<|system|>\n x \n<|user|>\nhi \n<|assistant|>\nyo\n<|assistant|>\n"
    )


class ByteStream:
    """One request's text stream, fed one byte-token at a time like the core would."""

    def __init__(self, stops: list[str]) -> None:
        tokenizer = Tokenizer.from_str(byte_tokenizer_json(SPECIALS))
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        self.generation = Generation(decode, [ord("a")], stops)
        self.sent: list[str] = []

    def push(self, token: int, finish: FinishReason | None = None) -> str:
        piece = self.generation.push(TokenEvent("r", [token], finish))
        self.sent.append(piece.text)
        return piece.text


def holdback(text: str, stops: list[str]) -> int:
    """The chapter's rule: the longest suffix of text that is a proper prefix of some stop."""
    return max(
        k
        for k in range(len(text) + 1)
        if any(len(s) > k and s.startswith(text[len(text) - k :]) for s in stops)
    )


@pytest.mark.parametrize(
    ("text", "stops", "expected", "finish"),
    [
        ("bcdefg", ["de"], "bc", "stop"),  # the chapter's example
        ("bcdefg", ["xyz"], "bcdefg", "length"),
        ("bcdcdx", ["cde"], "bcdcdx", "length"),  # a prefix that does not complete is released
        ("héllo wörld", ["wö"], "héllo ", "stop"),  # a stop string inside multi-byte characters
        ("a☃b☃c", ["☃c"], "a☃b", "stop"),
        ("naïve café", ["é"], "naïve caf", "stop"),
        ("x\xff\xfey", [], "x\ufffd\ufffdy", "length"),  # invalid bytes become U+FFFD
    ],
)
def test_text_stream_holds_back_stop_prefixes(
    text: str, stops: list[str], expected: str, finish: str
) -> None:
    data = text.encode("latin-1") if "\xff" in text else text.encode()
    stream = ByteStream(stops)
    for i, byte in enumerate(data):
        last = i == len(data) - 1
        stream.push(byte, FinishReason.LENGTH if last else None)
        sent = "".join(stream.sent)
        assert not any(s in sent for s in stops)  # never a stop string
        assert expected.startswith(sent), (sent, expected)
        if stream.generation.finish_reason is not None:
            break
        if stops:  # valid UTF-8 here: what is complete so far, minus the longest stop prefix
            complete = data[: i + 1].decode(errors="ignore")
            assert sent == complete[: len(complete) - holdback(complete, stops)], (sent, complete)
    assert "".join(stream.sent) == expected
    assert stream.generation.finish_reason == finish


def test_text_stream_byte_by_byte_chapter_steps() -> None:
    """After d the text not yet sent is d, a prefix of de: held back; after e it stops."""
    stream = ByteStream(["de"])
    assert [stream.push(b) for b in b"bcd"] == ["b", "c", ""]
    assert stream.push(ord("e")) == ""
    assert stream.generation.finish_reason == "stop"
    # a UTF-8 character split over two tokens waits for its second byte
    stream = ByteStream([])
    first, second = "é".encode()
    assert (stream.push(first), stream.push(second)) == ("", "é")
    # EOS is counted but is not text
    assert (stream.push(EOS, FinishReason.STOP), stream.generation.finish_reason) == ("", "stop")
    assert stream.generation.num_tokens == 3

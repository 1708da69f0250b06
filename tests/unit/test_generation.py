"""Generation (detokenize + stop holdback + counts) and the context budget, without a server;
the text stream byte by byte through the tiny models' byte tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from frontend.openai.conversion import context_budget
from frontend.text.generation import Generation
from shared.errors import ServingError
from shared.protocol import FinishReason, TokenEvent, TokenLogprob
from tests.fixtures.byte_tokenizer import byte_tokenizer_json
from tests.fixtures.tiny_model import EOS, SPECIALS


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def event(ids: list[int], finish: FinishReason | None = None) -> TokenEvent:
    logprobs = [TokenLogprob(i, -1.0, []) for i in ids]
    return TokenEvent("r", ids, finish, logprobs=logprobs)


def test_stop_string_split_across_tokens_is_never_sent() -> None:
    g = Generation(decode, [97], ["de"])
    pieces = [g.push(event([t])) for t in b"bcde"]
    assert [p.text for p in pieces] == ["b", "c", "", ""]
    assert pieces[-1].finish_reason == "stop"
    assert g.stopped_by_string and g.num_tokens == 4
    # the held-back "d" logprob rides on the final piece, not on an empty one
    assert [len(p.logprobs) for p in pieces] == [1, 1, 0, 2]


def test_held_text_is_released_at_the_finish() -> None:
    g = Generation(decode, [97], ["xyz"])
    assert g.push(event([ord("x")])).text == ""
    last = g.push(event([ord("y")], FinishReason.LENGTH))
    assert (last.text, last.finish_reason) == ("xy", "length")
    assert not g.stopped_by_string


def test_multibyte_character_waits_for_its_last_byte_and_eos_is_counted() -> None:
    g = Generation(decode, [97], [])
    e_acute = "é".encode()
    assert g.push(event([e_acute[0]])).text == ""
    assert g.push(event([e_acute[1]])).text == "é"
    last = g.push(event([256], FinishReason.STOP))
    assert (last.text, last.finish_reason, g.num_tokens) == ("", "stop", 3)


@pytest.mark.parametrize(
    ("requested", "num_prompt", "expected"), [(None, 3, 7), (7, 3, 7), (1, 9, 1)]
)
def test_context_budget(requested: int | None, num_prompt: int, expected: int) -> None:
    assert context_budget(requested, num_prompt, 10, "prompt") == expected


@pytest.mark.parametrize(("requested", "num_prompt"), [(None, 10), (8, 3), (1, 10)])
def test_context_budget_refuses(requested: int | None, num_prompt: int) -> None:
    with pytest.raises(ServingError) as refused:
        context_budget(requested, num_prompt, 10, "messages")
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "messages")


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
    """The holdback rule: the longest suffix of text that is a proper prefix of some stop."""
    return max(
        k
        for k in range(len(text) + 1)
        if any(len(s) > k and s.startswith(text[len(text) - k :]) for s in stops)
    )


@pytest.mark.parametrize(
    ("text", "stops", "expected", "finish"),
    [
        ("bcdefg", ["de"], "bc", "stop"),  # the worked example
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


def test_text_stream_byte_by_byte_by_hand() -> None:
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


def texts(g: Generation, *events: TokenEvent) -> list[str]:
    return [g.push(e).text for e in events]


def test_the_stop_token_is_not_text_unless_asked_for() -> None:
    stopped = [event([ord("b")]), event([ord("c")], FinishReason.STOP)]  # "c": a stop token
    assert texts(Generation(decode, [97], []), *stopped) == ["b", ""]
    assert texts(Generation(decode, [97], [], include_stop=True), *stopped) == ["b", "c"]


def test_include_stop_keeps_the_stop_string_and_nothing_after() -> None:
    g = Generation(decode, [97], ["cd"], include_stop=True)
    assert texts(g, event(list(b"bc")), event(list(b"def"))) == ["b", "cd"]
    assert g.finish_reason == "stop" and g.stopped_by_string


def test_stop_strings_count_only_after_min_tokens() -> None:
    g = Generation(decode, [97], ["b"], min_tokens=3)
    # "b" in the first three tokens is text; one after them stops the generation
    assert texts(g, event(list(b"ab")), event(list(b"cab"))) == ["ab", "ca"]
    assert g.finish_reason == "stop"
    g = Generation(decode, [97], ["xy"], min_tokens=2)
    assert texts(g, event([ord("x")]), event([ord("y")]), event(list(b"xy"))) == ["x", "y", ""]

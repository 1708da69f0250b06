"""Generation (detokenize + stop holdback + counts) and the context budget, without a server."""

from __future__ import annotations

import pytest

from frontend.openai.conversion import context_budget
from frontend.text.generation import Generation
from shared.errors import ServingError
from shared.protocol import FinishReason, TokenEvent, TokenLogprob


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

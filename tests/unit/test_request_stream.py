"""RequestStream: one HTTP request's answers over several Submits of n choices each; what
waits for a handler that lags is one merged event per choice, not one per step."""

from __future__ import annotations

import asyncio

import pytest

from frontend.core.request_stream import RequestStream
from shared.errors import ErrorCode, ServingError
from shared.protocol import FinishReason, TokenEvent, TokenLogprob


def ev(rid: str, index: int, finish: FinishReason | None = None) -> TokenEvent:
    return TokenEvent(rid, [1], finish, index=index)


async def test_choices_of_several_submits_come_out_prompt_major() -> None:
    stream = RequestStream(["a", "b"], n=2)
    assert not stream.put(ev("b", 1))
    assert not stream.put(ev("a", 0, FinishReason.LENGTH))
    assert [(await stream.get(0)).index for _ in range(2)] == [3, 0]  # type: ignore[union-attr]
    assert stream.put(ev("a", 1, FinishReason.STOP))  # a's last choice: a is done
    assert not stream.closed
    assert not stream.put(ev("b", 0, FinishReason.STOP))
    assert stream.put(ev("b", 1, FinishReason.STOP))
    assert stream.closed  # every choice of every Submit has finished


async def test_a_dropped_choice_is_finished_and_its_late_events_are_dropped() -> None:
    stream = RequestStream(["a"], n=2)
    assert stream.drop(1) == ("a", 1, False)
    assert not stream.put(ev("a", 1))  # in flight when the handler stopped it
    assert await stream.get(0) is None
    assert stream.put(ev("a", 0, FinishReason.LENGTH))
    assert stream.closed


async def test_admission_waits_for_every_submit_or_raises_the_refusal() -> None:
    stream = RequestStream(["a", "b"])
    waiter = asyncio.create_task(stream.admitted())
    stream.admit("a")
    await asyncio.sleep(0)
    assert not waiter.done()
    stream.put(ev("b", 0))  # an event is proof of admission
    await asyncio.wait_for(waiter, 1)
    refused = RequestStream(["a", "b"])
    refused.admit("a")
    refused.put(ServingError(ErrorCode.RATE_LIMIT_EXCEEDED, "full"))
    with pytest.raises(ServingError, match="full"):
        await refused.admitted()
    late = RequestStream(["a"])
    late.admit("a")
    late.put(ServingError(ErrorCode.NO_CAPACITY, "waited"))
    await late.admitted()  # admitted first: the refusal is the stream's to tell
    assert isinstance(await late.get(0), ServingError)


def logprob(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, [])


async def test_events_not_taken_yet_merge_into_one() -> None:
    stream = RequestStream(["r"])
    stream.put(TokenEvent("r", [1], None, num_prompt_tokens=5, num_cached_tokens=4))
    for token in range(2, 1001):
        stream.put(TokenEvent("r", [token]))
    stream.put(TokenEvent("r", [1001], FinishReason.LENGTH))
    assert stream.pending == 1 and stream.closed
    event = await stream.get()
    assert isinstance(event, TokenEvent)
    assert event.token_ids == list(range(1, 1002))
    assert (event.finish, event.num_prompt_tokens, event.num_cached_tokens) == (
        FinishReason.LENGTH,
        5,
        4,
    )


async def test_logprobs_merge_with_their_tokens_and_an_error_stays_apart() -> None:
    stream = RequestStream(["r"])
    stream.put(TokenEvent("r", [1], logprobs=[logprob(1)]))
    assert isinstance(await stream.get(), TokenEvent)  # taken: the next event is new
    stream.put(TokenEvent("r", [2], logprobs=[logprob(2)]))
    stream.put(TokenEvent("r", [3, 4], logprobs=[logprob(3), logprob(4)]))
    stream.put(ServingError(ErrorCode.ENGINE_UNAVAILABLE, "gone"))
    assert stream.pending == 2
    event = await stream.get()
    assert isinstance(event, TokenEvent)
    assert event.token_ids == [2, 3, 4]
    assert [lp.token_id for lp in event.logprobs or []] == [2, 3, 4]
    assert isinstance(await stream.get(), ServingError)


async def test_the_choices_of_a_request_merge_apart() -> None:
    stream = RequestStream(["r"], n=2)
    for token in range(1, 4):
        stream.put(TokenEvent("r", [token], index=0))
        stream.put(TokenEvent("r", [10 + token], index=1))
    assert stream.pending == 2
    first, second = await stream.get(0), await stream.get(0)
    assert isinstance(first, TokenEvent) and isinstance(second, TokenEvent)
    assert (first.index, first.token_ids) == (0, [1, 2, 3])
    assert (second.index, second.token_ids) == (1, [11, 12, 13])

"""RequestStream: one HTTP request's answers over several Submits of n choices each; what
waits for a handler that lags is one merged event per choice, not one per step."""

from __future__ import annotations

import asyncio

import pytest

from frontend.core.request_stream import MERGE_AFTER, RequestStream
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


async def taken(stream: RequestStream) -> list[TokenEvent]:
    events = []
    while (event := await stream.get(0)) is not None:
        assert isinstance(event, TokenEvent)
        events.append(event)
    return events


async def test_events_beyond_the_bound_merge_into_the_last() -> None:
    stream = RequestStream(["r"])
    stream.put(TokenEvent("r", [1], None, num_prompt_tokens=5, num_cached_tokens=4))
    for token in range(2, 1001):
        stream.put(TokenEvent("r", [token]))
    stream.put(TokenEvent("r", [1001], FinishReason.LENGTH))
    assert stream.pending == MERGE_AFTER and stream.closed
    events = await taken(stream)
    assert [t for e in events for t in e.token_ids] == list(range(1, 1002))
    assert [len(e.token_ids) for e in events[:-1]] == [1] * (MERGE_AFTER - 1)
    assert (events[0].num_prompt_tokens, events[0].num_cached_tokens) == (5, 4)
    assert events[-1].finish is FinishReason.LENGTH


async def test_a_handler_that_keeps_up_sees_one_event_per_step() -> None:
    stream = RequestStream(["r"])
    for token in range(1, 100):
        stream.put(TokenEvent("r", [token]))
        event = await stream.get(0)
        assert isinstance(event, TokenEvent) and event.token_ids == [token]


async def test_logprobs_merge_with_their_tokens_and_an_error_stays_apart() -> None:
    stream = RequestStream(["r"])
    last = MERGE_AFTER + 3
    for token in range(1, last + 1):
        stream.put(TokenEvent("r", [token], logprobs=[logprob(token)]))
    stream.put(ServingError(ErrorCode.ENGINE_UNAVAILABLE, "gone"))
    assert stream.pending == MERGE_AFTER + 1
    *_, merged = await taken_until_error(stream)
    assert merged.token_ids == list(range(MERGE_AFTER, last + 1))
    assert [lp.token_id for lp in merged.logprobs or []] == merged.token_ids


async def taken_until_error(stream: RequestStream) -> list[TokenEvent]:
    events = []
    while isinstance(event := await stream.get(0), TokenEvent):
        events.append(event)
    assert isinstance(event, ServingError)
    return events


async def test_the_choices_of_a_request_merge_apart() -> None:
    stream = RequestStream(["r"], n=2)
    for token in range(1, 3 * MERGE_AFTER):
        stream.put(TokenEvent("r", [token], index=0))
        stream.put(TokenEvent("r", [1000 + token], index=1))
    assert stream.pending == 2 * MERGE_AFTER
    events = await taken(stream)
    for index, base in ((0, 0), (1, 1000)):
        tokens = [t for e in events if e.index == index for t in e.token_ids]
        assert tokens == [base + t for t in range(1, 3 * MERGE_AFTER)]

"""RequestStream: one HTTP request's answers over several Submits of n choices each."""

from __future__ import annotations

import asyncio

import pytest

from frontend.core.request_stream import RequestStream
from shared.errors import ErrorCode, ServingError
from shared.protocol import FinishReason, TokenEvent


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

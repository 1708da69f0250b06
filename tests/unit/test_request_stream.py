"""RequestStream: what waits for a handler that lags is one merged event, not one per step."""

from __future__ import annotations

from frontend.core.request_stream import RequestStream
from shared.errors import ErrorCode, ServingError
from shared.protocol import FinishReason, TokenEvent, TokenLogprob


def logprob(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, [])


async def test_events_not_taken_yet_merge_into_one() -> None:
    stream = RequestStream("r")
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
    stream = RequestStream("r")
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

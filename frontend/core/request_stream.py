"""What the core sends back for one request, queued for the handler that waits on it."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from shared.errors import ErrorCode, ServingError
from shared.protocol import Rejected, RejectReason, TokenEvent

Item = TokenEvent | ServingError

# core refusal -> what the client sees
_REJECTIONS: Final = {
    RejectReason.QUEUE_FULL: ErrorCode.RATE_LIMIT_EXCEEDED,
    RejectReason.NO_CAPACITY: ErrorCode.NO_CAPACITY,
    RejectReason.SHUTTING_DOWN: ErrorCode.SHUTTING_DOWN,
    RejectReason.CONTEXT_LENGTH_EXCEEDED: ErrorCode.CONTEXT_LENGTH_EXCEEDED,
    RejectReason.INVALID: ErrorCode.INVALID_VALUE,
    RejectReason.INTERNAL: ErrorCode.INTERNAL_ERROR,
}


def rejection_error(message: Rejected) -> ServingError:
    return ServingError(_REJECTIONS[message.reason], message.message)


def unavailable(reason: str) -> ServingError:
    return ServingError(ErrorCode.ENGINE_UNAVAILABLE, f"The engine core is unavailable: {reason}.")


class RequestStream:
    """TokenEvents of one rid until one carries a finish, or a single ServingError.

    A handler that lags behind the core (its client reads slowly) finds one event holding
    every token that came meanwhile, not one event per step: what waits for a slow reader is
    bounded by its token count, and it catches up in one write.
    """

    __slots__ = ("_items", "_wakeup", "closed", "rid")

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self._items: deque[Item] = deque()
        self._wakeup = asyncio.Event()
        self.closed = False  # the core is done with this rid: finished, refused, aborted or lost

    @property
    def pending(self) -> int:
        """Items put and not yet taken."""
        return len(self._items)

    def put(self, item: Item) -> None:
        last = self._items[-1] if self._items else None
        if isinstance(item, TokenEvent) and isinstance(last, TokenEvent):
            _merge(last, item)
        else:
            self._items.append(item)
        if isinstance(item, ServingError) or item.finish is not None:
            self.closed = True
        self._wakeup.set()

    async def get(self, timeout: float | None = None) -> Item | None:
        """The next item; None if `timeout` seconds pass without one."""
        while not self._items:
            self._wakeup.clear()
            try:
                # an Event.wait lost to the timeout loses nothing (Queue.get could, on 3.11)
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                if not self._items:
                    return None
        return self._items.popleft()


def _merge(into: TokenEvent, later: TokenEvent) -> None:
    """Fold a later event of the same request into one not yet taken (the counts of the first
    event stay: they are the prompt's)."""
    into.token_ids.extend(later.token_ids)
    if later.logprobs is not None:
        if into.logprobs is None:
            into.logprobs = []
        into.logprobs.extend(later.logprobs)
    into.finish = later.finish

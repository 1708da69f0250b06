"""What the core sends back for one HTTP request, queued for the handler that waits on it."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from shared.errors import ErrorCode, ServingError
from shared.protocol import Rejected, RejectReason, TokenEvent

Item = TokenEvent | ServingError

MERGE_AFTER: Final = 16  # events of one choice waiting before later ones merge into the last

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
    return ServingError(
        _REJECTIONS[message.reason], message.message, retry_after=message.retry_after_s or None
    )


def unavailable(reason: str) -> ServingError:
    return ServingError(ErrorCode.ENGINE_UNAVAILABLE, f"The engine core is unavailable: {reason}.")


class RequestStream:
    """The TokenEvents of every choice of one HTTP request until each has finished, or a
    single ServingError.

    A handler that lags behind the core (its client reads slowly) finds at most MERGE_AFTER
    events per choice, the last holding every token that came meanwhile, not one event per
    step: what waits for a slow reader is bounded by its token count, and it catches up in a
    few writes. (A handler that keeps up sees one event per step.)

    The request is one Submit per prompt (`rids`), each with `n` choices; an event comes out
    with `index` rewritten to its choice in the whole request, prompt-major (p * n + j).
    """

    __slots__ = (
        "_dropped",
        "_error",
        "_items",
        "_last",
        "_left",
        "_offsets",
        "_queued",
        "_unadmitted",
        "_wakeup",
        "closed",
        "n",
        "rids",
    )

    def __init__(self, rids: list[str], n: int = 1) -> None:
        self.rids = rids
        self.n = n
        self._offsets = {rid: p * n for p, rid in enumerate(rids)}
        self._left = dict.fromkeys(rids, n)  # unfinished choices, by Submit
        self._unadmitted = set(rids)
        self._dropped: set[int] = set()  # choices the handler ended itself (a stop string)
        self._items: deque[Item] = deque()
        self._last: dict[int, TokenEvent] = {}  # the last queued event of each choice, by index
        self._queued: dict[int, int] = {}  # how many events of each choice are queued
        self._error: ServingError | None = None
        self._wakeup = asyncio.Event()
        self.closed = False  # the core is done with it: finished, refused, aborted or lost

    @property
    def rid(self) -> str:
        """The first Submit's rid (the request's, for logs)."""
        return self.rids[0]

    def admit(self, rid: str) -> None:
        """The core has queued `rid`."""
        self._unadmitted.discard(rid)
        self._wakeup.set()

    def put(self, item: Item) -> bool:
        """Queue an event (or the error that ends the request); True once the event's Submit
        has no unfinished choice left."""
        if isinstance(item, ServingError):
            if not self.closed:
                self.closed = True
                self._error = item
                self._items.append(item)
                self._wakeup.set()
            return True
        rid = item.rid
        self._unadmitted.discard(rid)  # an event is proof of admission
        item.index += self._offsets[rid]
        if item.index not in self._dropped:
            last = self._last.get(item.index)
            if last is not None and self._queued[item.index] >= MERGE_AFTER:
                _merge(last, item)
            else:
                self._last[item.index] = item
                self._queued[item.index] = self._queued.get(item.index, 0) + 1
                self._items.append(item)
            self._wakeup.set()
            if item.finish is not None:
                self._finish_choice(rid)
        return self._left[rid] == 0

    def drop(self, index: int) -> tuple[str, int, bool]:
        """The handler ends choice `index` itself: (its Submit's rid, its index there, whether
        that Submit has no unfinished choice left)."""
        rid = self.rids[index // self.n]
        if index not in self._dropped:
            self._dropped.add(index)
            self._finish_choice(rid)
        return rid, index % self.n, self._left[rid] == 0

    def _finish_choice(self, rid: str) -> None:
        self._left[rid] -= 1
        if not any(self._left.values()):
            self.closed = True

    async def admitted(self) -> None:
        """Return once every Submit is admitted; raise the error that came first instead."""
        while self._unadmitted and self._error is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._unadmitted and self._error is not None:
            raise self._error

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
        item = self._items.popleft()
        if isinstance(item, TokenEvent):
            self._queued[item.index] -= 1
            if self._last.get(item.index) is item:
                del self._last[item.index]
        return item

    @property
    def pending(self) -> int:
        """Items put and not yet taken."""
        return len(self._items)


def _merge(into: TokenEvent, later: TokenEvent) -> None:
    """Fold a later event of the same choice into one not yet taken (what only a first event
    carries stays: the prompt's counts, prompt logprobs, queue and prefill times)."""
    into.token_ids.extend(later.token_ids)
    if later.logprobs is not None:
        if into.logprobs is None:
            into.logprobs = []
        into.logprobs.extend(later.logprobs)
    into.finish = later.finish

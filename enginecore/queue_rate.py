"""QueueRate: how fast the admission queue drains, and so when a refused client may retry."""

from __future__ import annotations

import math
from collections import deque
from typing import Final

MIN_RETRY_S: Final = 1
MAX_RETRY_S: Final = 60
WINDOW_S: Final = 30.0


class QueueRate:
    """Requests leaving the queue (scheduled for the first time) per second, over the last
    WINDOW_S seconds (or since the start, if shorter).

    A refused client is told to retry after the queue ahead of it would have drained at that
    rate: (depth + 1) / rate seconds, within [MIN_RETRY_S, MAX_RETRY_S]; MAX_RETRY_S when
    nothing left the queue in the window although it holds requests.
    """

    def __init__(self, now: float, window_s: float = WINDOW_S) -> None:
        self._start = now
        self._window_s = window_s
        self._admissions: deque[tuple[float, int]] = deque()  # (time, requests admitted then)
        self._in_window = 0
        self._total = 0

    def record(self, now: float, admitted_total: int) -> None:
        """The scheduler's count of admitted requests, as of `now`."""
        if admitted_total > self._total:
            self._admissions.append((now, admitted_total - self._total))
            self._in_window += admitted_total - self._total
            self._total = admitted_total
        while self._admissions and self._admissions[0][0] < now - self._window_s:
            self._in_window -= self._admissions.popleft()[1]

    def per_second(self, now: float) -> float:
        self.record(now, self._total)
        span = min(self._window_s, now - self._start)
        return self._in_window / span if span > 0 else 0.0

    def retry_after_s(self, now: float, depth: int) -> int:
        """Whole seconds until `depth` waiting requests, and then one more, would have left."""
        rate = self.per_second(now)
        if rate <= 0:
            return MAX_RETRY_S if depth else MIN_RETRY_S
        return min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil((depth + 1) / rate)))

"""The drain gate at the frontend's door: counts requests in flight, refuses them while draining.

Admission proper (the bounded queue, 429) is the core's, global across frontends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from shared.errors import ErrorCode, ServingError


class DrainGate:
    """In-flight API requests; after drain() every new one gets 503 shutting_down."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def admit(self) -> Iterator[None]:
        if self.draining:
            # another replica (or this one's successor) may take the retry at once
            raise ServingError(
                ErrorCode.SHUTTING_DOWN, "The server is shutting down.", retry_after=1
            )
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def drain(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing is in flight; False if `timeout` seconds pass first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

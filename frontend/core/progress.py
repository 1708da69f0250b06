"""CoreProgress: how long the engine core has gone without stepping through the work it has."""

from __future__ import annotations

from shared.protocol import Stats


class CoreProgress:
    """What the core client sees of the core's progress, since the core handshook.

    The core shows progress by a Step (or Embedded) for this frontend, by a Stats whose step
    count moved, or by a Stats that says it has nothing to do. Silence shows nothing: a core
    wedged inside a step answers no message, so its time without progress keeps growing.
    """

    __slots__ = ("_since", "_steps")

    def __init__(self, now: float) -> None:
        self._since = now  # the last time the core was seen stepping, or idle
        self._steps: int | None = None

    def restart(self, now: float) -> None:
        """A core handshook: it starts with a clean record."""
        self._since = now
        self._steps = None

    def stepped(self, now: float) -> None:
        self._since = now

    def stats(self, stats: Stats, now: float) -> None:
        moved = self._steps is not None and stats.steps_total != self._steps
        idle = stats.active_sequences == 0 and stats.queue_depth == 0
        self._steps = stats.steps_total
        if moved or idle:
            self._since = now

    def stalled_for(self, now: float) -> float:
        """Seconds since the core last stepped or was idle."""
        return now - self._since

"""Stop-string holdback: release streamed text only once it cannot begin a stop string."""

from __future__ import annotations


class StopMatcher:
    """Cuts a text stream at its first stop string, never sending any part of one (or, with
    `include`, sending it whole and nothing after it).

    "First" means the occurrence that completes first as the text grows (on a tie, the
    one that starts earlier): generation would have ended there, whatever the chunking.
    """

    __slots__ = ("_held", "_include", "_max_hold", "_stopped", "_stops")

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self._include = include
        # An empty stop string would match before any text: ignore it.
        self._stops = [s for s in dict.fromkeys(stops) if s]
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def push(self, text: str) -> str:
        """Return the part of everything unsent (held + text) that is safe to send now."""
        if self._stopped:
            return ""
        pending = self._held + text
        cut = self._first_stop(pending)
        if cut is not None:
            self._stopped = True
            self._held = ""
            return pending[: cut[1] if self._include else cut[0]]
        keep = self._holdback(pending)
        self._held = pending[len(pending) - keep :]
        return pending[: len(pending) - keep]

    def finish(self) -> str:
        """Generation ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return "" if self._stopped else held

    def _first_stop(self, pending: str) -> tuple[int, int] | None:
        """(start, end) of the stop occurrence in `pending` that ends first, or None."""
        best: tuple[int, int] | None = None  # (end, start)
        for stop in self._stops:
            start = pending.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start)
                if best is None or candidate < best:
                    best = candidate
        return None if best is None else (best[1], best[0])

    def _holdback(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of a stop."""
        for k in range(min(len(pending), self._max_hold), 0, -1):
            tail = pending[-k:]
            if any(len(s) > k and s.startswith(tail) for s in self._stops):
                return k
        return 0

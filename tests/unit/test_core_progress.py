"""CoreProgress: what counts as the core's progress, and what does not."""

from __future__ import annotations

from frontend.core.progress import CoreProgress
from shared.protocol import Stats


def stats(steps: int, active: int = 0, queued: int = 0) -> Stats:
    return Stats(queue_depth=queued, active_sequences=active, steps_total=steps)


def test_steps_and_idleness_are_progress_silence_is_not() -> None:
    p = CoreProgress(0.0)
    p.restart(10.0)
    assert p.stalled_for(12.0) == 2.0  # silent since the handshake
    p.stepped(13.0)
    assert p.stalled_for(15.0) == 2.0
    p.stats(stats(5, active=1), 16.0)  # the first count is a baseline, not a move
    assert p.stalled_for(16.0) == 3.0
    p.stats(stats(6, active=1), 17.0)  # it moved
    assert p.stalled_for(17.0) == 0.0
    p.stats(stats(6, queued=2), 20.0)  # work, the same count: no progress
    assert p.stalled_for(20.0) == 3.0
    p.stats(stats(6), 21.0)  # nothing to do: not stalled
    assert p.stalled_for(21.0) == 0.0


def test_a_restart_forgets_the_old_core() -> None:
    p = CoreProgress(0.0)
    p.stats(stats(100, active=1), 1.0)
    p.restart(5.0)
    p.stats(stats(0, active=1), 6.0)  # a new core counts from 0: a baseline, not a move
    assert p.stalled_for(6.0) == 1.0

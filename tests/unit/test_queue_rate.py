"""QueueRate: Retry-After from the rate at which the queue drained, bounded."""

from __future__ import annotations

from enginecore.queue_rate import MAX_RETRY_S, MIN_RETRY_S, QueueRate


def test_retry_after_is_the_time_the_queue_ahead_takes_at_the_measured_rate() -> None:
    rate = QueueRate(now=0.0, window_s=30.0)
    for second in range(1, 11):  # 2 requests leave the queue every second
        rate.record(float(second), 2 * second)
    assert rate.per_second(10.0) == 2.0
    assert rate.retry_after_s(10.0, depth=9) == 5  # (9 + 1) / 2
    assert rate.retry_after_s(10.0, depth=0) == MIN_RETRY_S
    assert rate.retry_after_s(10.0, depth=10_000) == MAX_RETRY_S


def test_a_stalled_queue_says_the_most_and_old_admissions_age_out() -> None:
    rate = QueueRate(now=0.0, window_s=30.0)
    rate.record(1.0, 50)
    assert rate.retry_after_s(2.0, depth=4) == 1  # 50 in 2 s: gone in no time
    assert rate.retry_after_s(100.0, depth=4) == MAX_RETRY_S  # nothing left it for 30 s
    assert rate.retry_after_s(100.0, depth=0) == MIN_RETRY_S

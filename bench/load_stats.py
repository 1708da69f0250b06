"""Per-request records of a load run and the per-level summary computed from them."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec


class Dist(msgspec.Struct, frozen=True):
    """Mean, percentiles and maximum of one latency, in milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float


class LevelReport(msgspec.Struct, frozen=True, kw_only=True):
    """One load level: counts, throughput and latency distributions."""

    concurrency: int | None  # closed loop: requests in flight
    request_rate: float | None  # open loop: Poisson arrivals per second
    num_requests: int  # planned
    sent: int
    completed: int
    failed: int
    failures: dict[str, int]  # by HTTP status ("429") or kind ("timeout", "stream_error", ...)
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_input_tokens: int
    total_output_tokens: int
    ttft_ms: Dist | None
    tpot_ms: Dist | None
    itl_ms: Dist | None
    e2e_ms: Dist | None
    hit_deadline: bool  # --max-seconds cut the level short


class RunReport(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON result file of one run: one server, several levels."""

    label: str  # the line's name in plots
    base_url: str
    model: str
    endpoint: str
    started: str  # ISO 8601, UTC
    settings: dict[str, str | int | float | bool | None]  # the command line
    levels: list[LevelReport]


@dataclass(slots=True)
class RequestRecord:
    """What one request did; times are seconds since the request was sent."""

    failure: str | None = None  # None: completed
    detail: str = ""
    token_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    end: float = 0.0  # the stream's end ([DONE]), or the failure
    output_tokens: int = 0
    input_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def tpot(self) -> float | None:
        return tpot(self.end, self.ttft, self.output_tokens)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} not in [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def dist_ms(seconds: Sequence[float]) -> Dist | None:
    """The distribution of durations given in seconds, reported in ms; None if empty."""
    if not seconds:
        return None
    ms = [s * 1000.0 for s in seconds]
    return Dist(
        mean=sum(ms) / len(ms),
        p50=percentile(ms, 50),
        p90=percentile(ms, 90),
        p99=percentile(ms, 99),
        max=max(ms),
    )


def tpot(e2e: float, ttft: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
    if ttft is None or output_tokens < 2:
        return None
    return (e2e - ttft) / (output_tokens - 1)


def itls(token_times: Sequence[float]) -> list[float]:
    """Inter-token latencies: the gaps between consecutive content chunks."""
    return [b - a for a, b in itertools.pairwise(token_times)]


def summarize(
    records: Sequence[RequestRecord],
    *,
    concurrency: int | None,
    request_rate: float | None,
    num_requests: int,
    duration_s: float,
    hit_deadline: bool,
) -> LevelReport:
    """The level's report; throughput counts completed requests only."""
    done = [r for r in records if r.failure is None]
    failures = Counter(r.failure for r in records if r.failure is not None)
    output_tokens = sum(r.output_tokens for r in done)
    rate = 1.0 / duration_s if duration_s > 0 else 0.0
    return LevelReport(
        concurrency=concurrency,
        request_rate=request_rate,
        num_requests=num_requests,
        sent=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        failures=dict(sorted(failures.items())),
        duration_s=duration_s,
        requests_per_s=len(done) * rate,
        output_tokens_per_s=output_tokens * rate,
        total_input_tokens=sum(r.input_tokens for r in done),
        total_output_tokens=output_tokens,
        ttft_ms=dist_ms([t for r in done if (t := r.ttft) is not None]),
        tpot_ms=dist_ms([t for r in done if (t := r.tpot) is not None]),
        itl_ms=dist_ms([gap for r in done for gap in itls(r.token_times)]),
        e2e_ms=dist_ms([r.end for r in done]),
        hit_deadline=hit_deadline,
    )

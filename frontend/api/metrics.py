"""Prometheus metrics: the core's gauges and counters (fetched per scrape) and the frontend's own."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from shared.protocol import Stats

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS: Final = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_FRONTEND_PREFIX: Final = "tl_frontend_"
_E2E_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _CoreCollector(Collector):
    """The core's Stats as of this scrape; nothing when the core did not answer."""

    def __init__(self) -> None:
        self.stats: Stats | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # the families exist only while a core answers

    def collect(self) -> Iterable[Metric]:
        s = self.stats
        if s is None:
            return
        blocks = GaugeMetricFamily(
            "tl_engine_kv_blocks", "KV cache blocks by state", labels=["state"]
        )
        blocks.add_metric(["used"], s.kv_blocks_used)
        blocks.add_metric(["free"], s.kv_blocks_free)
        blocks.add_metric(["cached"], s.kv_blocks_cached)
        yield blocks
        gauges = (
            ("tl_engine_queue_depth", "Admitted requests waiting to run", s.queue_depth),
            ("tl_engine_active_sequences", "Sequences running", s.active_sequences),
            ("tl_engine_batch_tokens", "Tokens in the last step's batch", s.batch_tokens),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        ratio = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
        yield GaugeMetricFamily(
            "tl_engine_prefix_cache_hit_ratio", "Prompt tokens found in the prefix cache", ratio
        )
        counters = (
            ("tl_engine_preemptions", "Sequences preempted", s.preemptions_total),
            (
                "tl_engine_kv_evictions",
                "KV blocks evicted from the prefix cache",
                s.kv_evictions_total,
            ),
            ("tl_engine_spec_proposed_tokens", "Draft tokens proposed", s.spec_proposed_total),
            ("tl_engine_spec_accepted_tokens", "Draft tokens accepted", s.spec_accepted_total),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        yield from _grammar_metrics(s)


def _grammar_metrics(s: Stats) -> Iterable[Metric]:
    """Constrained decoding: how many requests, what compiling and masking cost."""
    yield CounterMetricFamily(
        "tl_engine_constrained_requests",
        "Requests taken with a grammar (structured outputs, tool calls)",
        value=s.constrained_requests_total,
    )
    yield SummaryMetricFamily(
        "tl_engine_grammar_compile_seconds",
        "Time to build a constrained request's grammar matcher",
        count_value=s.constrained_requests_total,
        sum_value=s.grammar_compile_seconds_total,
    )
    yield SummaryMetricFamily(
        "tl_engine_grammar_mask_seconds",
        "Time per step to mask the logits of constrained rows (steps with any)",
        count_value=s.grammar_masked_steps_total,
        sum_value=s.grammar_mask_seconds_total,
    )


class Metrics:
    """One registry per frontend (never the global one), rendered as Prometheus text."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.time_to_first_token = Histogram(
            "tl_frontend_time_to_first_token_seconds",
            "From request arrival to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.time_per_output_token = Histogram(
            "tl_frontend_time_per_output_token_seconds",
            "Mean time between generated tokens, per request",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.e2e_request_latency = Histogram(
            "tl_frontend_e2e_request_latency_seconds",
            "From request arrival to its last token",
            buckets=_E2E_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "tl_frontend_requests",
            "HTTP requests answered, by route and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self._core = _CoreCollector()
        self.registry.register(self._core)

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self, stats: Stats | None, peers: Sequence[str] = ()) -> bytes:
        """The exposition text; core metrics only if `stats` came from a live core.

        `peers` are the texts of the other workers of a `--workers` group: their frontend
        samples are added to ours (the core's are the same core's, so only ours count).
        """
        self._core.stats = stats
        try:
            own = generate_latest(self.registry)
        finally:
            self._core.stats = None
        if not peers:
            return own
        return _merge(own.decode(), peers)


class _Families(Collector):
    """Already-built metric families, to be rendered by generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _merge(own: str, peers: Sequence[str]) -> bytes:
    """Our families, with each peer's `tl_frontend_*` samples added (`*_created`: the earliest)."""
    families = {f.name: f for f in text_string_to_metric_families(own)}
    values: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
    for family in families.values():
        for sample in family.samples:
            values[family.name, sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    for text in peers:
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(_FRONTEND_PREFIX) or family.name not in families:
                continue
            for sample in family.samples:
                key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    families[family.name].samples.append(sample)  # a label set only it has seen
                    values[key] = sample.value
                elif sample.name.endswith("_created"):
                    values[key] = min(values[key], sample.value)
                else:
                    values[key] += sample.value
    merged = []
    for family in families.values():
        out = Metric(family.name, family.documentation, family.type, family.unit)
        for sample in family.samples:
            key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
            out.add_sample(sample.name, sample.labels, values[key])
        merged.append(out)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged))
    return generate_latest(registry)


class RequestTimer:
    """Times one generation request into the latency histograms."""

    __slots__ = ("_arrival", "_first", "_metrics", "_tokens")

    def __init__(self, metrics: Metrics, arrival: float) -> None:
        self._metrics = metrics
        self._arrival = arrival  # time.monotonic()
        self._first: float | None = None
        self._tokens = 0

    def tokens(self, count: int) -> None:
        if self._first is None and count:
            self._first = time.monotonic()
            self._metrics.time_to_first_token.observe(self._first - self._arrival)
        self._tokens += count

    def finish(self) -> None:
        end = time.monotonic()
        self._metrics.e2e_request_latency.observe(end - self._arrival)
        if self._first is not None and self._tokens > 1:
            self._metrics.time_per_output_token.observe((end - self._first) / (self._tokens - 1))

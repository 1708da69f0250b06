"""Prometheus metrics: the core's gauges and counters (fetched per scrape) and the frontend's own."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from shared.protocol import Stats, TokenEvent

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS: Final = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_E2E_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_LENGTH_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class _CoreCollector(Collector):
    """The core's Stats as of this scrape; nothing when the core did not answer. Each figure
    under its tl_engine_* name, and under vLLM's name (with a model_name label) where vLLM
    has one."""

    def __init__(self, model_name: str) -> None:
        self.stats: Stats | None = None
        self._model = [model_name]

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
            ("tl_engine_steps", "Engine steps (forward passes)", s.steps_total),
            (
                "tl_engine_prefill_tokens",
                "Prompt tokens the forward pass computed (prefix-cache hits and forks aside)",
                s.prefill_tokens_total,
            ),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
        yield from self._vllm(s)

    def _vllm(self, s: Stats) -> Iterable[Metric]:
        usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        gauges = (
            ("vllm:num_requests_running", "Sequences running", s.active_sequences),
            ("vllm:num_requests_waiting", "Requests waiting to run", s.queue_depth),
            ("vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", usage),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(self._model, value)
            yield gauge
        counters = (
            ("vllm:prefix_cache_queries", "Prompt tokens looked up", s.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prompt tokens found cached", s.prefix_cache_hits),
            ("vllm:num_preemptions", "Sequences preempted", s.preemptions_total),
            ("vllm:spec_decode_num_drafts", "Draft verifications", s.spec_drafts_total),
            ("vllm:spec_decode_num_draft_tokens", "Draft tokens", s.spec_proposed_total),
            (
                "vllm:spec_decode_num_accepted_tokens",
                "Draft tokens accepted",
                s.spec_accepted_total,
            ),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(self._model, value)
            yield counter


class Metrics:
    """One registry per frontend (never the global one), rendered as Prometheus text.

    The frontend's figures have a tl_frontend_* name and, where vLLM has one, its vLLM name
    too (with a model_name label: the canonical served id).
    """

    def __init__(self, model_name: str = "") -> None:
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
        self.client_disconnects = Counter(
            "tl_frontend_client_disconnects",
            "Generation requests whose client went away before the answer was complete",
            registry=self.registry,
        )
        self.vllm = _VllmMetrics(self.registry, model_name)
        # what a --workers group sums: the frontend's own families (the core is one core)
        self._own = {family.name for family in self.registry.collect()}
        self._core = _CoreCollector(model_name)
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
        return _merge(own.decode(), peers, self._own)


class _VllmMetrics:
    """The frontend's figures under vLLM's names, for one model."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Any:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry).labels(
                model_name
            )

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, ["model_name"], registry=registry).labels(model_name)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")
        self._success = Counter(
            "vllm:request_success",
            "Finished requests (choices), by finish reason",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        self._model_name = model_name
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "From request arrival to its first token",
            _LATENCY_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Between one choice's successive token events",
            _TOKEN_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds", "From arrival to the last token", _E2E_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Waiting in the core's queue", _E2E_BUCKETS
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "From first scheduled to the first token",
            _E2E_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "From the first token to the last", _E2E_BUCKETS
        )
        self.prompt_length = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", _LENGTH_BUCKETS
        )
        self.generation_length = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", _LENGTH_BUCKETS
        )

    def success(self, finished_reason: str) -> None:
        self._success.labels(model_name=self._model_name, finished_reason=finished_reason).inc()


class _Families(Collector):
    """Already-built metric families, to be rendered by generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _merge(own: str, peers: Sequence[str], summed: set[str]) -> bytes:
    """Our families, with each peer's samples of the `summed` families added (`*_created`: the
    earliest)."""
    families = {f.name: f for f in text_string_to_metric_families(own)}
    values: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
    for family in families.values():
        for sample in family.samples:
            values[family.name, sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    for text in peers:
        for family in text_string_to_metric_families(text):
            if family.name not in summed or family.name not in families:
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
    """Times one generation request (all its choices) into the latency histograms and counts
    its tokens."""

    __slots__ = ("_arrival", "_first", "_last", "_metrics", "_started", "_tokens", "_vllm")

    def __init__(self, metrics: Metrics, arrival: float) -> None:
        self._metrics = metrics
        self._vllm = metrics.vllm
        self._arrival = arrival  # time.monotonic()
        self._first: float | None = None
        self._last: dict[int, float] = {}  # the last token event of each choice
        self._tokens = 0
        self._started = False

    def event(self, event: TokenEvent) -> None:
        """One choice's event: its tokens, and the core's queue and prefill times once."""
        if not self._started:
            self._started = True
            self._vllm.queue_time.observe(event.queue_s)
            self._vllm.prefill_time.observe(event.prefill_s)
        count = len(event.token_ids)
        if not count:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = now
            self._metrics.time_to_first_token.observe(now - self._arrival)
            self._vllm.time_to_first_token.observe(now - self._arrival)
        last = self._last.get(event.index)
        if last is not None:
            self._vllm.inter_token_latency.observe(now - last)
        self._last[event.index] = now
        self._tokens += count
        self._vllm.generation_tokens.inc(count)

    def finish(self, num_prompt_tokens: int, finish_reasons: Sequence[str]) -> None:
        """Every choice has finished, for these reasons."""
        end = time.monotonic()
        self._metrics.e2e_request_latency.observe(end - self._arrival)
        self._vllm.e2e_request_latency.observe(end - self._arrival)
        if self._first is not None:
            self._vllm.decode_time.observe(end - self._first)
            if self._tokens > 1:
                per_token = (end - self._first) / (self._tokens - 1)
                self._metrics.time_per_output_token.observe(per_token)
        self._vllm.prompt_tokens.inc(num_prompt_tokens)
        self._vllm.prompt_length.observe(num_prompt_tokens)
        self._vllm.generation_length.observe(self._tokens)
        for reason in finish_reasons:
            self._vllm.success(reason)

    def abandon(self) -> None:
        """The client went away before the answer was complete."""
        self._metrics.client_disconnects.inc()
        self._vllm.success("abort")

"""Metrics: vLLM's names beside the tl_* ones; a --workers group sums the frontends' families
(tl_frontend_* and the frontend's vllm:*), never the core's."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from frontend.api.metrics import Metrics, RequestTimer
from shared.protocol import FinishReason, Stats, TokenEvent

STATS = Stats(
    kv_blocks_used=3,
    kv_blocks_total=12,
    queue_depth=2,
    active_sequences=4,
    prefix_cache_queries=100,
    prefix_cache_hits=40,
    steps_total=9,
    prefill_tokens_total=77,
)


def samples(text: bytes | str) -> dict[str, float]:
    text = text.decode() if isinstance(text, bytes) else text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def served(metrics: Metrics) -> None:
    """One request of two choices: 3 prompt tokens, 2 + 1 tokens, finished by length and stop."""
    timer = RequestTimer(metrics, arrival=0.0)
    timer.event(TokenEvent("r", [5, 6], None, queue_s=0.5, prefill_s=0.25))
    timer.event(TokenEvent("r", [7], FinishReason.STOP, index=1))
    timer.finish(3, ["length", "stop"])


def test_core_and_frontend_figures_under_both_names() -> None:
    metrics = Metrics("m")
    served(metrics)
    got = samples(metrics.render(STATS))
    m = "model_name=m"
    assert got[f"vllm:kv_cache_usage_perc{{{m}}}"] == 0.25
    assert got[f"vllm:num_requests_running{{{m}}}"] == 4
    assert got[f"vllm:num_requests_waiting{{{m}}}"] == 2
    assert (
        got[f"vllm:prefix_cache_queries_total{{{m}}}"],
        got[f"vllm:prefix_cache_hits_total{{{m}}}"],
    ) == (100, 40)
    assert (got["tl_engine_steps_total"], got["tl_engine_prefill_tokens_total"]) == (9, 77)
    assert got[f"vllm:prompt_tokens_total{{{m}}}"] == 3
    assert got[f"vllm:generation_tokens_total{{{m}}}"] == 3
    assert got[f"vllm:request_success_total{{finished_reason=length,{m}}}"] == 1
    assert got[f"vllm:request_success_total{{finished_reason=stop,{m}}}"] == 1
    assert got[f"vllm:request_queue_time_seconds_sum{{{m}}}"] == 0.5
    assert got[f"vllm:request_prefill_time_seconds_sum{{{m}}}"] == 0.25
    assert got[f"vllm:time_to_first_token_seconds_count{{{m}}}"] == 1
    assert got["tl_frontend_time_to_first_token_seconds_count"] == 1
    # no core answered: no core families, the frontend's still there
    alone = samples(metrics.render(None))
    assert not any(k.startswith(("tl_engine", "vllm:num_requests", "vllm:kv")) for k in alone)
    assert alone[f"vllm:prompt_tokens_total{{{m}}}"] == 3


def test_a_worker_group_sums_the_frontends_only() -> None:
    ours, peer = Metrics("m"), Metrics("m")
    served(ours)
    served(peer)
    peer.client_disconnects.inc()
    merged = samples(ours.render(STATS, [peer.render(STATS).decode()]))
    m = "model_name=m"
    assert merged[f"vllm:prompt_tokens_total{{{m}}}"] == 6
    assert merged[f"vllm:request_success_total{{finished_reason=stop,{m}}}"] == 2
    assert merged["tl_frontend_client_disconnects_total"] == 1
    assert merged[f"vllm:num_requests_running{{{m}}}"] == 4  # the one core, counted once
    assert merged["tl_engine_steps_total"] == 9

"""The overload check: 64 streams against 16 running requests.

tl-serve with max_num_seqs 16 and queue_capacity 8 admits at most 24 of 64 concurrent clients;
the rest must be refused immediately (429) rather than wait in a queue that only grows.
llama-server with 16 slots gets the same clients: it queues whatever does not fit a slot.
The latency of each refusal comes from tl-bench's own per-request records.
"""

from __future__ import annotations

from typing import Any

from bench.load import first_model
from bench.load_client import Progress, run_level
from bench.load_stats import RequestRecord, dist_ms
from bench.load_workload import LengthDist, Workload, stream_fields
from bench.server_process import ServerProcess, in_checkout

QUEUE_CAPACITY = 8
MAX_NUM_SEQS = 16  # tl-serve's running requests, llama-server's slots
TL_ENGINE = {"queue_capacity": QUEUE_CAPACITY, "max_num_seqs": MAX_NUM_SEQS}
CONCURRENCY = 64
REQUESTS = 128
SEED = 7


def _dist(seconds: list[float]) -> dict[str, float] | None:
    d = dist_ms(seconds)
    return None if d is None else {"p50": d.p50, "p99": d.p99, "max": d.max}


def summarize(records: list[RequestRecord]) -> dict[str, Any]:
    """Counts by outcome, the refusals' latency, and the admitted requests' TTFT and e2e."""
    refused = [r.end for r in records if r.failure == "429"]
    done = [r for r in records if r.failure is None]
    other: dict[str, int] = {}
    for r in records:
        if r.failure not in (None, "429"):
            other[str(r.failure)] = other.get(str(r.failure), 0) + 1
    detail = next((r.detail for r in records if r.failure == "429"), "")
    return {
        "sent": len(records),
        "completed": len(done),
        "rejected_429": len(refused),
        "other_failures": other,
        "rejection_ms": _dist(refused),
        "completed_ttft_ms": _dist([t for r in done if (t := r.ttft) is not None]),
        "completed_e2e_ms": _dist([r.end for r in done]),
        "first_429_body": detail[:200],
    }


async def overload(server: ServerProcess, load: float) -> dict[str, Any]:
    """Run the check against a started server; the figures for the report."""
    model = await first_model(server.base_url)
    workload = Workload(
        endpoint="chat",
        input_len=LengthDist(32, 64),
        output_len=LengthDist(128, 128),
        fields=stream_fields(model, 0.0, True),
    )
    progress = Progress(f"overload {server.label} c={CONCURRENCY}", REQUESTS)
    result = await run_level(
        server.base_url + workload.path,
        workload.bodies(REQUESTS, SEED),
        concurrency=CONCURRENCY,
        request_rate=None,
        max_concurrency=None,
        max_seconds=240.0,
        timeout_s=240.0,
        seed=SEED,
        progress=progress,
    )
    progress.close()
    figures = summarize(result.records)
    print(f"overload {server.label}:", figures, flush=True)
    return figures | {
        "label": server.label,
        "argv": [in_checkout(a) for a in server.argv],
        "concurrency": CONCURRENCY,
        "requests": REQUESTS,
        "duration_s": result.duration_s,
        "loadavg": load,
    }

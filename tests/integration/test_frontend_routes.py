"""Models, tokenize, embeddings, health and metrics, against a fake core."""

from __future__ import annotations

import base64
import re
import struct
from typing import Any

import aiohttp
import pytest

from tests.conftest import TinyModels
from tests.fixtures.fake_core import fake_embedding
from tests.fixtures.frontend_harness import serving

pytestmark = pytest.mark.integration


async def fetch(method: str, url: str, body: Any = None) -> tuple[int, Any, str]:
    async with aiohttp.ClientSession() as session, session.request(method, url, json=body) as r:
        ctype = r.headers["Content-Type"]
        return (
            r.status,
            await r.json() if r.content_type == "application/json" else await r.text(),
            ctype,
        )


async def test_models(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, listing, _ = await fetch("GET", s.api + "/v1/models")
        assert status == 200
        [entry] = listing["data"]
        assert listing["object"] == "list"
        assert entry == {
            "id": "succ",
            "object": "model",
            "created": entry["created"],
            "owned_by": "tl-serve",
            "max_model_len": 1024,  # the (fake) core's
        }
        assert isinstance(entry["created"], int)
        assert await fetch("GET", s.api + "/v1/models/succ") == (200, entry, "application/json")
        status, doc, _ = await fetch("GET", s.api + "/v1/models/other")
        assert (status, doc["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"prompt": "abc"}, [97, 98, 99]),
        ({"prompt": "<|im_start|>a"}, [257, 97]),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "!"}]}, [104, 105, 33]),
    ],
)  # fmt: skip
async def test_tokenize(tiny: TinyModels, body: dict[str, Any], tokens: list[int]) -> None:
    async with serving(tiny.succ, core={"max_model_len": 512}) as s:
        status, doc, _ = await fetch("POST", s.api + "/v1/tokenize", {"model": "succ"} | body)
    assert status == 200
    assert doc == {"tokens": tokens, "count": len(tokens), "max_model_len": 512}


async def test_tokenize_needs_prompt_or_messages(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, doc, _ = await fetch("POST", s.api + "/v1/tokenize", {"model": "succ"})
    assert (status, doc["error"]["code"]) == (400, "missing_required_parameter")


def unpack(b64: str) -> list[float]:
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@pytest.mark.parametrize("encoding", [None, "float", "base64"])
async def test_embeddings(tiny: TinyModels, encoding: str | None) -> None:
    body: dict[str, Any] = {"model": "succ", "input": ["ab", "c"]}
    if encoding is not None:
        body["encoding_format"] = encoding
    async with serving(tiny.succ) as s:
        status, doc, _ = await fetch("POST", s.api + "/v1/embeddings", body)
    assert status == 200
    assert doc["object"] == "list" and doc["model"] == "succ"
    assert doc["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [d["index"] for d in doc["data"]] == [0, 1]
    assert {d["object"] for d in doc["data"]} == {"embedding"}
    vectors = [d["embedding"] for d in doc["data"]]
    if encoding == "base64":
        vectors = [unpack(v) for v in vectors]
    for got, ids in zip(vectors, [[97, 98], [99]], strict=True):
        assert got == pytest.approx(fake_embedding(ids), rel=1e-6)


async def test_embeddings_of_token_ids(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        status, doc, _ = await fetch(
            "POST", s.api + "/v1/embeddings", {"model": "succ", "input": [[1, 2, 3]]}
        )
        assert status == 200
        assert doc["data"][0]["embedding"] == pytest.approx(fake_embedding([1, 2, 3]))
        status, doc, _ = await fetch(
            "POST", s.api + "/v1/embeddings", {"model": "succ", "input": [[1, 999]]}
        )
        assert (status, doc["error"]["param"]) == (400, "input[0]")


async def test_health_and_readiness(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        for url in (s.api + "/healthz", s.health + "/healthz", s.health + "/readyz"):
            status, _, _ = await fetch("GET", url)
            assert status == 200, url
        status, doc, _ = await fetch("GET", s.health + "/v1/models")
        assert (status, doc["error"]["code"]) == (404, "not_found")  # the API is not on it


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} missing"
    return float(match[1])


async def test_metrics(tiny: TinyModels) -> None:
    async with serving(tiny.succ) as s:
        body = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "max_tokens": 3}
        await fetch("POST", s.api + "/v1/chat/completions", body)
        await fetch("POST", s.api + "/v1/chat/completions", body | {"model": "x"})
        status, text, ctype = await fetch("GET", s.health + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    # the fake core's Stats, as of the scrape (nothing running now)
    assert sample(text, 'tl_engine_kv_blocks{state="used"}') == 0
    assert sample(text, 'tl_engine_kv_blocks{state="free"}') == 1024
    assert sample(text, "tl_engine_queue_depth") == 0
    assert sample(text, "tl_engine_active_sequences") == 0
    assert sample(text, "tl_engine_prefix_cache_hit_ratio") == pytest.approx(0.4)
    assert sample(text, "tl_engine_preemptions_total") == 3
    for name in ("batch_tokens", "kv_evictions_total", "spec_proposed_tokens_total"):
        sample(text, f"tl_engine_{name}")
    sample(text, "tl_engine_spec_accepted_tokens_total")
    ok = 'tl_frontend_requests_total{endpoint="/v1/chat/completions",status="200"}'
    missing = 'tl_frontend_requests_total{endpoint="/v1/chat/completions",status="404"}'
    assert sample(text, ok) == 1 and sample(text, missing) == 1
    assert sample(text, "tl_frontend_time_to_first_token_seconds_count") == 1
    assert sample(text, "tl_frontend_time_per_output_token_seconds_count") == 1
    assert sample(text, "tl_frontend_e2e_request_latency_seconds_count") == 1


async def test_metrics_without_a_core_has_only_frontend_metrics(tiny: TinyModels) -> None:
    async with serving(tiny.succ, wait_ready=False, core={"silent": True}) as s:
        status, text, _ = await fetch("GET", s.health + "/metrics")
    assert status == 200
    assert "tl_engine_" not in text
    assert "tl_frontend_e2e_request_latency_seconds" in text

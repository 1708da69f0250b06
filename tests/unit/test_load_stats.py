"""bench.load's pure parts: statistics, SSE framing and chunks, workloads, argument checks."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.load import api_root
from bench.load_sse import SSEDecoder, read_chunk
from bench.load_stats import RequestRecord, dist_ms, itls, percentile, summarize, tpot
from bench.load_workload import LengthDist, Messages, Workload, read_prompts, stream_fields

Prompt = str | Messages

# ---- statistics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),  # rank 2.7: 3 + 0.7 * (4 - 3)
        ([4.0, 1.0, 3.0, 2.0], 90, 3.7),  # order does not matter
        ([7.0], 99, 7.0),
        ([0.0, 10.0], 99, 9.9),
    ],
)
def test_percentile_by_hand(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == pytest.approx(want)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0, 100),
)
def test_percentile_equals_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_percentile_refuses_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0], 101)


def test_tpot_excludes_the_first_token() -> None:
    assert tpot(1.0, 0.1, 10) == pytest.approx(0.1)  # 9 gaps in 0.9 s
    assert tpot(0.5, 0.2, 2) == pytest.approx(0.3)
    assert tpot(1.0, 0.1, 1) is None  # one token: no time per output token
    assert tpot(1.0, None, 10) is None  # no visible token


def test_itls_are_gaps_between_chunks() -> None:
    assert itls([0.1, 0.15, 0.35, 0.35]) == pytest.approx([0.05, 0.2, 0.0])
    assert itls([0.2]) == []
    assert itls([]) == []


def test_dist_in_milliseconds() -> None:
    d = dist_ms([0.001, 0.002, 0.003, 0.010])
    assert d is not None
    assert (d.mean, d.p50, d.max) == pytest.approx((4.0, 2.5, 10.0))
    assert d.p90 == pytest.approx(7.9)  # rank 2.7 between 3 and 10
    assert dist_ms([]) is None


def test_summarize_counts_failures_by_status_and_completed_work_only() -> None:
    ok1 = RequestRecord(token_times=[0.1, 0.2, 0.4], end=0.5, output_tokens=5, input_tokens=7)
    ok2 = RequestRecord(token_times=[0.3], end=0.3, output_tokens=1, input_tokens=3)
    refused = [RequestRecord(failure="429", end=0.01, output_tokens=99) for _ in range(2)]
    broken = RequestRecord(failure="stream_error", token_times=[9.0], end=9.5, output_tokens=3)
    report = summarize(
        [ok1, refused[0], ok2, broken, refused[1]],
        concurrency=4,
        request_rate=None,
        num_requests=6,
        duration_s=2.0,
        hit_deadline=False,
    )
    assert (report.sent, report.completed, report.failed) == (5, 2, 3)
    assert report.failures == {"429": 2, "stream_error": 1}
    assert (report.total_output_tokens, report.total_input_tokens) == (6, 10)
    assert report.output_tokens_per_s == pytest.approx(3.0)
    assert report.requests_per_s == pytest.approx(1.0)
    assert report.ttft_ms is not None and report.ttft_ms.max == pytest.approx(300.0)
    assert report.ttft_ms.p50 == pytest.approx(200.0)
    # TPOT of ok1 only: (0.5 - 0.1) / 4; ok2 has one token
    assert report.tpot_ms is not None and report.tpot_ms.mean == pytest.approx(100.0)
    assert report.itl_ms is not None and report.itl_ms.max == pytest.approx(200.0)
    assert report.itl_ms.mean == pytest.approx(150.0)  # gaps 0.1 and 0.2, pooled
    assert report.e2e_ms is not None and report.e2e_ms.max == pytest.approx(500.0)


def test_summarize_all_failed_has_no_distributions() -> None:
    report = summarize(
        [RequestRecord(failure="connection")],
        concurrency=None,
        request_rate=2.0,
        num_requests=1,
        duration_s=0.0,
        hit_deadline=True,
    )
    assert (report.completed, report.failed, report.output_tokens_per_s) == (0, 1, 0.0)
    assert report.ttft_ms is None and report.itl_ms is None and report.e2e_ms is None


# ---- SSE ---------------------------------------------------------------------------------------

STREAM = (
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    ": ping\n\n"
    'data: {"choices":[{"index":0,"delta":{"content":"h\u00e9"}}]}\r\n\r\n'
    "event: message\nid: 7\n"
    'data: {"choices":[{"index":0,"delta":{"content":"\u2603"},"finish_reason":"length"}]}\n\n'
    'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
    "data: [DONE]\n\n"
).encode()


def test_sse_events_in_one_read() -> None:
    events = SSEDecoder().feed(STREAM)
    assert len(events) == 5 and events[-1] == "[DONE]"
    assert [read_chunk(e).text for e in events[:-1]] == ["", "h\u00e9", "\u2603", ""]
    assert read_chunk(events[3]).usage == (5, 3)


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_sse_events_do_not_depend_on_read_boundaries(cuts: list[int]) -> None:
    # every split, including inside a multi-byte character or between \r and \n
    bounds = [0, *sorted(cuts), len(STREAM)]
    decoder = SSEDecoder()
    events = [e for a, b in itertools.pairwise(bounds) for e in decoder.feed(STREAM[a:b])]
    assert events == SSEDecoder().feed(STREAM)


def test_sse_multiline_data_and_unfinished_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\ndata:b\n\ndata: c\n") == ["a\nb"]
    assert decoder.feed(b"\n") == ["c"]
    assert decoder.feed(b"data: never finished") == []


def test_read_chunk_shapes() -> None:
    completion = read_chunk('{"object":"text_completion","choices":[{"text":"abc","index":0}]}')
    assert (completion.text, completion.usage, completion.error) == ("abc", None, None)
    reasoning = read_chunk('{"choices":[{"delta":{"reasoning_content":"hm"}}],"usage":null}')
    assert (reasoning.text, reasoning.usage) == ("hm", None)
    error = read_chunk('{"error":{"message":"core died","type":"server_error","code":null}}')
    assert error.error is not None and "core died" in error.error
    assert read_chunk("not json").error is not None


# ---- workloads and arguments -----------------------------------------------------------------


def test_length_dist() -> None:
    assert LengthDist.parse("128") == (128, 128)
    assert LengthDist.parse("64:256") == (64, 256)
    rng = random.Random(0)
    assert {LengthDist.parse("3:5").sample(rng) for _ in range(200)} == {3, 4, 5}
    for bad in ("0", "5:3", "x", "-2:4"):
        with pytest.raises(ValueError, match="LOW:HIGH"):
            LengthDist.parse(bad)


def workload(
    endpoint: str = "chat", shared_prefix_len: int = 0, file_prompts: Sequence[Prompt] = ()
) -> Workload:
    fields = stream_fields("m", 0.0, ignore_eos=True)
    return Workload(
        endpoint, LengthDist(4, 8), LengthDist(10, 20), fields, shared_prefix_len, file_prompts
    )


def test_bodies_stream_with_usage_and_ignore_eos() -> None:
    bodies = workload().bodies(20, seed=1)
    assert bodies == workload().bodies(20, seed=1)  # a seed gives the same bodies
    assert bodies != workload().bodies(20, seed=2)
    for body in bodies:
        assert body["stream"] is True and body["ignore_eos"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert 10 <= body["max_tokens"] <= 20
        [message] = body["messages"]
        assert message["role"] == "user" and 4 <= len(message["content"].split()) <= 8
    assert "ignore_eos" not in stream_fields("m", 0.0, ignore_eos=False)


def test_shared_prefix_bodies_share_the_system_prompt_only() -> None:
    bodies = workload(shared_prefix_len=300).bodies(5, seed=0)
    systems = {b["messages"][0]["content"] for b in bodies}
    users = {b["messages"][1]["content"] for b in bodies}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 300
    assert len(users) == 5
    prompts = workload("completions", shared_prefix_len=50).bodies(2, seed=0)
    assert all(p["prompt"].startswith(prompts[0]["prompt"][:200]) for p in prompts)


def test_prompts_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    path.write_text(json.dumps({"prompt": "once"}) + "\n\n" + json.dumps({"messages": msgs}) + "\n")
    items = read_prompts(path)
    assert items == ["once", msgs]
    bodies = workload(file_prompts=items).bodies(3, seed=0)
    once = [{"role": "user", "content": "once"}]
    assert [b["messages"] for b in bodies] == [once, msgs, once]  # cycled
    with pytest.raises(ValueError, match="chat endpoint"):
        workload("completions", file_prompts=items)
    path.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1"):
        read_prompts(path)


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://localhost:8000/v1/", "http://localhost:8000"),
        ("http://127.3.2.1:9", "http://127.3.2.1:9"),
        ("http://[::1]:8000/v1", "http://[::1]:8000"),
    ],
)
def test_loopback_urls(url: str, root: str) -> None:
    assert api_root(url, allow_remote=False) == root


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com", "http://8.8.8.8"])
def test_remote_urls_need_allow_remote(url: str) -> None:
    with pytest.raises(ValueError, match="allow-remote"):
        api_root(url, allow_remote=False)
    assert api_root(url, allow_remote=True) == url

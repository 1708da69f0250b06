"""bench.load (`tl-bench`) against a real tl-serve on loopback: a few requests per level, the
JSON result checked against what the server was told to do."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import REPO, child_env, default_engine, live_server

pytestmark = pytest.mark.integration

MAX_TOKENS = 16


def run_bench(api: str, out: Path, *args: str) -> dict[str, Any]:
    """`python -m bench.load` as a user runs it; the result file it wrote."""
    argv = [sys.executable, "-m", "bench.load", "--base-url", api, "--out", str(out), *args]
    done = subprocess.run(
        argv, cwd=REPO, env=child_env(), capture_output=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"done" in done.stderr  # the progress line
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_levels_complete_and_count_exactly_max_tokens(tiny: TinyModels, tmp_path: Path) -> None:
    # the random tiny llama: without ignore_eos some replies end early, and many of its
    # tokens are partial UTF-8 or special, so content chunks undercount: usage must be read
    engine = default_engine(tiny.hf, model_id="tiny")
    out = tmp_path / "result.json"
    with live_server(tmp_path / "server", engine) as server:
        doc = run_bench(
            server.api + "/v1",
            out,
            *("--concurrency", "1,4", "--num-requests", "6", "--input-len", "3:9"),
            *("--output-len", str(MAX_TOKENS), "--label", "smoke"),
        )
    assert (doc["label"], doc["model"], doc["endpoint"]) == ("smoke", "tiny", "chat")
    assert doc["base_url"] == server.api  # /v1 stripped; the model found by /v1/models
    assert [level["concurrency"] for level in doc["levels"]] == [1, 4]
    for level in doc["levels"]:
        assert (level["sent"], level["completed"], level["failed"]) == (6, 6, 0), level
        assert level["failures"] == {} and not level["hit_deadline"]
        # ignore_eos: every request ran to max_tokens, counted from the usage chunk
        assert level["total_output_tokens"] == 6 * MAX_TOKENS
        assert level["total_input_tokens"] >= 6 * 3
        tokens_per_s = level["total_output_tokens"] / level["duration_s"]
        assert level["output_tokens_per_s"] == pytest.approx(tokens_per_s)
        assert level["requests_per_s"] == pytest.approx(6 / level["duration_s"])
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            d = level[name]
            assert 0 <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (name, d)
        assert level["ttft_ms"]["max"] <= level["e2e_ms"]["max"]
    png = out.with_suffix(".png")
    if importlib.util.find_spec("matplotlib") is not None:  # the optional `bench` extra
        assert png.read_bytes().startswith(b"\x89PNG")


def test_queue_full_refusals_count_as_429_failures(tiny: TinyModels, tmp_path: Path) -> None:
    # one running sequence, one waiting, steps slowed: of 4 requests sent at once two are
    # refused, and each refused worker's next request is refused too until one finishes
    engine = default_engine(
        tiny.succ, model_id="succ", queue_capacity=1, max_num_seqs=1, step_delay_ms=40
    )
    with live_server(tmp_path / "server", engine) as server:
        doc = run_bench(
            server.api,
            tmp_path / "result.json",
            *("--concurrency", "4", "--num-requests", "8", "--input-len", "4"),
            *("--output-len", str(MAX_TOKENS), "--no-plot", "--model", "succ"),
        )
    [level] = doc["levels"]
    assert level["sent"] == 8 and level["completed"] + level["failed"] == 8
    assert set(level["failures"]) == {"429"}, level["failures"]
    assert level["failures"]["429"] == level["failed"] >= 2
    assert level["completed"] >= 2  # the running one and the queued one
    assert level["total_output_tokens"] == level["completed"] * MAX_TOKENS
    assert not (tmp_path / "result.png").exists()

"""bench.compare's report: targets against llama-server, and RESULTS.md sections kept per model."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from bench.compare import model_key
from bench.compare_load import _reseeded, run_files
from bench.compare_report import compose, levels_by_label, long_section, prefix_section, table
from bench.compare_targets import KQUANT_AND_LARGE, ratios, round_label, target_for
from bench.load_stats import Dist, LevelReport, RunReport
from bench.server_process import ROOT


def level(c: int, tok_s: float, ttft_p99: float) -> LevelReport:
    d = Dist(mean=ttft_p99, p50=ttft_p99, p90=ttft_p99, p99=ttft_p99, max=ttft_p99)
    return LevelReport(
        concurrency=c, request_rate=None, num_requests=8, sent=8, completed=8, failed=0,
        failures={}, duration_s=10.0, requests_per_s=0.8, output_tokens_per_s=tok_s,
        total_input_tokens=400, total_output_tokens=1024, ttft_ms=d, tpot_ms=d, itl_ms=d,
        e2e_ms=d, hit_deadline=False,
    )  # fmt: skip


def row(lines: list[str], c: int) -> str:
    return next(line for line in lines if line.startswith(f"| {c} |"))


def test_bundled_targets_are_judged_against_llama_server_at_the_same_level() -> None:
    levels = {
        "tl-serve": {1: level(1, 150.0, 50), 4: level(4, 300, 900), 16: level(16, 600, 500)},
        "llama-server -np 64": {1: level(1, 100, 40), 4: level(4, 200, 800), 16: level(16, 250, 900)},
    }  # fmt: skip
    lines = ratios(levels, "bundled")
    assert "1.50x | yes (>= 1.5x)" in row(lines, 1)
    assert "| - |" in row(lines, 1)  # no TTFT target at one stream
    assert row(lines, 4).endswith("| 900 / 800 | **no** (below) |")
    assert "2.40x | **no** (>= 3x)" in row(lines, 16)
    assert row(lines, 16).endswith("| 500 / 900 | yes (below) |")


def test_a_model_without_targets_gets_ratios_only_and_other_anchors_a_column() -> None:
    levels = {
        "tl-serve": {1: level(1, 120.0, 50)},
        "llama-server -np 64": {1: level(1, 100, 40)},
        "llama-cpp-python": {1: level(1, 60, 40)},
    }
    lines = ratios(levels, "Q8_0")
    assert "| 1.20x | - |" in row(lines, 1)
    assert row(lines, 1).endswith(" 2.00x |")
    assert any("No target is set for `Q8_0`" in line for line in lines)
    assert ratios({"tl-serve": levels["tl-serve"]}, "bundled")[0].startswith("(no ")


def test_a_model_section_replaces_its_own_and_keeps_the_others() -> None:
    first = compose("", {"1.7B": "## big\n", "bundled": "## small v1\n"}, "## Soak\nfine\n")
    assert first.index("## small v1") < first.index("## big") < first.index("## Soak")
    assert first.count("## small v1") == 1 and first.count("## big") == 1
    second = compose(first, {"bundled": "## small v2\n"}, None)
    assert "## small v2" in second and "## small v1" not in second
    assert "## big" in second and "## Soak\nfine" in second
    assert compose(second, {}, None) == second


def test_the_soak_section_of_an_unmarked_file_is_kept() -> None:
    old = "# title\n\n## Results\nold table\n\n## Soak\n\nsoak figures\n\n## Machine\nold cpu\n"
    out = compose(old, {"bundled": "## new\n"}, None)
    assert "soak figures" in out and "old table" not in out and "old cpu" not in out


@pytest.mark.parametrize(("name", "key"), [("bundled", "bundled"), ("1.7B", "1.7B"),
                                            ("/x/my-model.Q4_0.gguf", "my-model.Q4_0")])  # fmt: skip
def test_model_key(name: str, key: str) -> None:
    assert model_key(name) == key


def test_a_repeated_level_gets_new_prompts_of_the_same_lengths() -> None:
    flags = ["--concurrency", "16", "--input-len", "32:64", "--seed", "16"]
    assert _reseeded(list(flags), 0) == flags
    assert _reseeded(list(flags), 2) == [*flags[:-1], "2016"]
    assert _reseeded(["--concurrency", "1"], 1) == ["--concurrency", "1"]


def test_a_level_where_nothing_completed_has_no_ratio() -> None:
    empty = LevelReport(
        concurrency=64, request_rate=None, num_requests=64, sent=64, completed=0, failed=64,
        failures={"deadline": 64}, duration_s=240.0, requests_per_s=0.0, output_tokens_per_s=0.0,
        total_input_tokens=0, total_output_tokens=0, ttft_ms=None, tpot_ms=None, itl_ms=None,
        e2e_ms=None, hit_deadline=True,
    )  # fmt: skip
    levels = {"tl-serve": {64: empty}, "llama-server -np 64": {64: empty}}
    assert row(ratios(levels, "1.7B"), 64) == "| 64 | 0.0 | 0.0 | - | - | - / - | - |"
    # a target level: met only when tl-serve completed everything and llama-server nothing
    at16 = msgspec.structs.replace(empty, concurrency=16)
    levels = {"tl-serve": {16: level(16, 27.0, 900)}, "llama-server -np 64": {16: at16}}
    assert "| - | yes (>= 2x; llama-server completed none) |" in row(ratios(levels, "1.7B"), 16)
    levels = {"tl-serve": {16: at16}, "llama-server -np 64": {16: at16}}
    assert "| - | **no** (>= 2x) |" in row(ratios(levels, "1.7B"), 16)
    partial = msgspec.structs.replace(level(16, 27.0, 900), completed=7, failed=1)
    levels = {"tl-serve": {16: partial}, "llama-server -np 64": {16: at16}}
    assert "| - | **no** (>= 2x) |" in row(ratios(levels, "1.7B"), 16)


def test_the_large_shape_targets_hold_for_each_of_its_files() -> None:
    for key in ("1.7B", "1.7B-Q4_K_M", "1.7B-Q4_1-pure"):
        assert target_for(key) == KQUANT_AND_LARGE
    assert target_for("360M") is None and target_for("Q8_0") is None


def test_rounds_are_shown_side_by_side_and_judged_on_their_median() -> None:
    tl, anchor = "tl-serve", "llama-server -np 64"
    rounds = [  # (tl-serve, llama-server) tok/s at 16 and TTFT p99 per round
        ((540.0, 800), (170.0, 3000)),
        ((450.0, 900), (175.0, 3100)),
        ((600.0, 3500), (180.0, 3200)),
    ]
    levels = {}
    for r, ((tl_tok, tl_p99), (ll_tok, ll_p99)) in enumerate(rounds, 1):
        levels[round_label(tl, r)] = {16: level(16, tl_tok, tl_p99), 1: level(1, 200.0, 60)}
        levels[round_label(anchor, r)] = {16: level(16, ll_tok, ll_p99), 1: level(1, 100, 200)}
    lines = ratios(levels, "bundled")
    at16 = row(lines, 16)
    assert "| 540.0, 450.0, 600.0 | 170.0, 175.0, 180.0 |" in at16
    assert "| 3.18x, 2.57x, 3.33x | 3.18x | yes (>= 3x) |" in at16  # the median round's
    assert at16.endswith("| 800 / 3,000; 900 / 3,100; 3,500 / 3,200 | **no** (below in 2 of 3) |")
    assert "| 2.00x, 2.00x, 2.00x | 2.00x | yes (>= 1.5x) | " in row(lines, 1)
    # a server run once beside the rounds (another numerics mode) gets a column
    levels["tl-serve numerics=int8"] = {16: level(16, 700.0, 700)}
    assert row(ratios(levels, "bundled"), 16).endswith(" 700.0 (4.00x) |")  # over 175.0
    assert row(ratios(levels, "bundled"), 1).endswith(" - |")
    del levels["tl-serve numerics=int8"]
    # a round without its llama-server run is left out of the ratios
    del levels[round_label(anchor, 3)]
    assert "| 3.18x, 2.57x | 2.87x | **no** (>= 3x) |" in row(ratios(levels, "bundled"), 16)


def test_a_summary_renders_from_its_own_reports_once_the_run_files_are_gone(
    tmp_path: Path,
) -> None:
    # the summary is kept in the repository (bench/results-<model>.json); bench/out/, where
    # each run wrote its report, is the measuring machine's own
    runs = []
    for label, tok_s in (("tl-serve", 321.0), ("llama-server -np 64", 123.0)):
        report = RunReport(
            label=label, base_url="http://127.0.0.1:1", model="m", endpoint="chat",
            started="2026-12-06T00:00:00+00:00", settings={}, levels=[level(16, tok_s, 900)],
        )  # fmt: skip
        path = tmp_path / f"{label}.json"
        path.write_bytes(msgspec.json.encode(report))
        kept = run_files(path, [f"{ROOT}/.venv/bin/python", "-m", "bench.load"])
        runs.append({"label": label, "concurrency": 16, "other_cores": 0.0, "server_cores": 1.9,
                     **kept})  # fmt: skip
    record = {"runs": runs, "kv_tokens": 65536}
    assert runs[0]["command"] == ".venv/bin/python -m bench.load"  # the same from any clone
    summary = json.loads(json.dumps(record))  # as written to and read back from the file
    for path in tmp_path.iterdir():
        path.unlink()
    rows = table(levels_by_label(summary["runs"]), summary["runs"])
    assert any(r.startswith("| tl-serve | 16 | 8/0 | 321.0 |") for r in rows)
    assert any(r.startswith("| llama-server -np 64 | 16 | 8/0 | 123.0 |") for r in rows)
    assert any("| tl-serve | 16 | 8/0 | 900 | 900 | 321.0 |" in r
               for r in prefix_section(summary["runs"]))  # fmt: skip


def test_the_long_prompt_phase_puts_tl_serve_beside_llama_server_per_concurrency() -> None:
    runs = []
    for label, levels in (
        ("tl-serve", [level(1, 30.0, 4000), level(4, 60.0, 9000)]),
        ("llama-server -np 4", [level(1, 10.0, 10000), level(4, 40.0, 30000)]),
    ):
        report = RunReport(
            label=label, base_url="http://127.0.0.1:1", model="m", endpoint="chat",
            started="2026-12-07T00:00:00+00:00", settings={}, levels=levels,
        )  # fmt: skip
        runs.append({"label": label, "report": msgspec.to_builtins(report)})
    lines = long_section(runs)
    assert "| llama-server -np 4 | 4 | 8/0 | 30,000 | 30,000 | 40.0 |" in lines[5]
    assert lines[6:] == [
        "\nAt concurrency 1: tl-serve 3.00x llama-server -np 4's output tok/s, "
        "TTFT p50 4,000 / 10,000 ms.",
        "\nAt concurrency 4: tl-serve 1.50x llama-server -np 4's output tok/s, "
        "TTFT p50 9,000 / 30,000 ms.",
    ]


def test_a_run_compiled_as_an_older_cpu_is_a_section_of_its_own_with_the_same_targets() -> None:
    # NUMBA_CPU_FEATURES (bench/isa.py) must not replace the host's own figures
    told = "+avx2,-avx512f,-avx512vnni,-avxvnni,-avx512bf16,-avx512vbmi"
    assert model_key("bundled", told) == "bundled@avx2"
    assert model_key("/x/my-model.Q4_0.gguf", told) == "my-model.Q4_0@avx2"
    assert target_for("bundled@avx2") == target_for("bundled") is not None
    assert target_for("1.7B-Q4_K_M@avx2") == target_for("1.7B")

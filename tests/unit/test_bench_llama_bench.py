"""bench.llama_bench: llama.cpp's benchmark records turned into bench.model / bench.engine lines."""

from __future__ import annotations

from bench.llama_bench import batched_context, format_batched, format_llama_bench


def test_llama_bench_records_become_pp_and_tg_lines() -> None:
    tests = [
        {"n_prompt": 512, "n_gen": 0, "avg_ts": 370.25, "stddev_ts": 3.5},
        {"n_prompt": 0, "n_gen": 128, "avg_ts": 180.0, "stddev_ts": 1.25},
    ]
    pp, tg = format_llama_bench(tests, 5, "llama.cpp X")
    assert (
        pp.startswith("llama-bench pp512 ")
        and "370.2 tok/s (sd 3.5 over 5 runs, llama.cpp X)" in pp
    )
    assert tg.startswith("llama-bench tg128 ") and "180.0 tok/s" in tg


def test_batched_lines_count_output_tokens_over_the_whole_time() -> None:
    rows = [{"pp": 64, "tg": 128, "pl": 4, "t_pp": 1.0, "speed_pp": 256.0, "t_tg": 3.0,
             "speed_tg": 170.7, "t": 4.0, "speed": 192.0}]  # fmt: skip
    (line,) = format_batched(rows)
    assert line.startswith("  B=  4:   128.0 tok/s")  # 4 x 128 / 4.0 s
    assert "prompts 256.0 tok/s, generation alone 170.7 tok/s" in line


def test_batched_context_covers_every_sequence_in_256_token_shares() -> None:
    assert batched_context(64, 128, [1, 4, 16, 64]) == 64 * 256
    assert batched_context(200, 128, [1, 2]) == 2 * 512

"""The paged, chunked, batched forward equals the dense float64 numpy reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from enginecore.batch import Batch, SeqChunk
from enginecore.kernels import gemm
from enginecore.model_runner import ModelRunner
from shared.config import EngineConfig
from tests.conftest import TinyModels
from tests.fixtures import reference

BLOCK = 4
REFERENCE = Path(__file__).resolve().parents[1] / "data" / "greedy.json"


def runner_for(
    path: Path,
    num_blocks: int = 128,
    block_size: int = BLOCK,
    numerics: str = "exact",
    kv_cache_dtype: str = "f32",
) -> ModelRunner:
    return ModelRunner.from_path(path, block_size, num_blocks, 0, 512, numerics, kv_cache_dtype)


def ref_for(path: Path) -> tuple[dict[str, object], reference.State]:
    return (
        reference.state_from_gguf(path) if path.suffix == ".gguf" else reference.state_from_hf(path)
    )


def prefill(runner: ModelRunner, ids: list[int], table: list[int], chunk: int) -> np.ndarray:
    """Feed `ids` in chunks of `chunk`; return the logits of every position (len(ids), vocab)."""
    rows = []
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        batch = Batch.build([SeqChunk(part, start, table, len(part))], runner.block_size)
        rows.append(runner.run(batch))
    return np.concatenate(rows)


def greedy(runner: ModelRunner, prompt: list[int], n: int, table: list[int]) -> list[int]:
    logits = prefill(runner, prompt, table, len(prompt))
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n:
        chunk = SeqChunk([out[-1]], len(prompt) + len(out) - 1, table, 1)
        out.append(int(np.argmax(runner.run(Batch.build([chunk], runner.block_size))[0])))
    return out


PROMPT = [
    72,
    101,
    108,
    108,
    111,
    44,
    32,
    119,
    111,
    114,
    108,
    100,
    33,
    10,
    257,
    3,
    200,
    17,
    99,
    100,
    101,
]


@pytest.mark.parametrize("numba_calls_blas", [True, False])
@pytest.mark.parametrize("which", ["hf", "gguf_f32", "gguf_quant"])
def test_prefill_logits_equal_reference(
    tiny: TinyModels, which: str, numba_calls_blas: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not numba_calls_blas:  # as where numpy's BLAS is not the bundled OpenBLAS
        monkeypatch.setattr(gemm, "AVAILABLE", False)
    path = getattr(tiny, which)
    runner = runner_for(path)
    cfg, state = ref_for(path)
    want, _ = reference.forward(cfg, state, PROMPT)
    got = prefill(runner, PROMPT, list(range(8)), len(PROMPT))  # > 8 rows: the BLAS path
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    got_small = prefill(runner, PROMPT, list(range(8)), 3)  # <= 8 rows: the quantized kernels
    np.testing.assert_allclose(got_small, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_gguf_and_safetensors_give_the_same_logits(tiny: TinyModels) -> None:
    a = prefill(runner_for(tiny.hf), PROMPT, list(range(8)), 5)
    b = prefill(runner_for(tiny.gguf_f32), PROMPT, list(range(8)), 5)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(a).max())


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 8, 9, 16, len(PROMPT)])
def test_chunked_prefill_equals_prefill_at_once(tiny: TinyModels, chunk: int) -> None:
    runner = runner_for(tiny.gguf_quant)
    whole = prefill(runner, PROMPT, list(range(8)), len(PROMPT))
    chunked = prefill(runner, PROMPT, list(range(8, 16)), chunk)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-4 * np.abs(whole).max())


def test_scattered_blocks_equal_contiguous(tiny: TinyModels) -> None:
    runner = runner_for(tiny.hf)
    contiguous = prefill(runner, PROMPT, list(range(6)), 4)
    scattered = prefill(runner, PROMPT, [97, 3, 120, 41, 64, 9], 4)
    np.testing.assert_array_equal(scattered, contiguous)


def test_batch_of_unrelated_sequences_equals_each_alone(tiny: TinyModels) -> None:
    runner = runner_for(tiny.gguf_quant)
    prompts = [PROMPT, [5, 6, 7], list(range(40, 70)), [1]]
    tables = [list(range(i * 10, i * 10 + 10)) for i in range(4)]
    alone = [prefill(runner, p, t, len(p))[-1] for p, t in zip(prompts, tables, strict=True)]
    # again, all at once, in fresh blocks: prefills of different lengths plus decodes in one call
    tables = [list(range(50 + i * 10, 60 + i * 10)) for i in range(4)]
    prefill(runner, prompts[2][:-1], tables[2], 64)  # these two are "decoding": [2] has a
    prompts[3] = [9, 1]  # cached prefix, [3] is a one-token prompt after one cached token
    alone[3] = prefill(runner, prompts[3], list(range(40, 50)), 2)[-1]
    prefill(runner, prompts[3][:-1], tables[3], 1)
    chunks = [
        SeqChunk(prompts[0], 0, tables[0], 1),
        SeqChunk(prompts[1], 0, tables[1], 1),
        SeqChunk(prompts[2][-1:], len(prompts[2]) - 1, tables[2], 1),
        SeqChunk(prompts[3][-1:], len(prompts[3]) - 1, tables[3], 1),
    ]
    together = runner.run(Batch.build(chunks, runner.block_size))
    np.testing.assert_allclose(
        together, np.stack(alone), rtol=0, atol=1e-4 * np.abs(together).max()
    )


def test_hidden_states_are_the_final_normed_rows(tiny: TinyModels) -> None:
    runner = runner_for(tiny.hf)
    cfg, state = ref_for(tiny.hf)
    _, want = reference.forward(cfg, state, PROMPT)
    chunk = SeqChunk(PROMPT, 0, list(range(8)), len(PROMPT))
    got = runner.run(Batch.build([chunk], runner.block_size), return_hidden=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("which", ["hf", "gguf_quant", "gguf_q8_0", "gguf_q4_k_m"])
def test_greedy_ids_equal_reference(tiny: TinyModels, which: str) -> None:
    path = getattr(tiny, which)
    cfg, state = ref_for(path)
    want = reference.greedy(cfg, state, PROMPT[:6], 24)
    assert greedy(runner_for(path), PROMPT[:6], 24, list(range(12))) == want


def test_succ_model_counts_up(tiny: TinyModels) -> None:
    assert greedy(runner_for(tiny.succ), [ord("a")], 3, [0]) == [ord("b"), ord("c"), ord("d")]


# the settings that keep every reference continuation of the bundled model (bench/README.md:
# int8 parts from 4 of the 9)
REPRODUCING = [("exact", "f32"), ("int16", "f32"), ("int16", "f16")]


def test_the_default_settings_are_among_those_that_reproduce_the_reference() -> None:
    assert (EngineConfig().numerics, EngineConfig().kv_cache_dtype) in REPRODUCING


@pytest.mark.slow
@pytest.mark.parametrize(("numerics", "kv"), REPRODUCING)
def test_bundled_model_reproduces_reference_greedy(
    bundled_model: Path, numerics: str, kv: str
) -> None:
    """Every record of greedy.json (an independent fp32 implementation), 48 ids ignoring EOS."""
    records = json.loads(REFERENCE.read_text())["records"]
    runner = runner_for(bundled_model, num_blocks=16, block_size=16, numerics=numerics,
                        kv_cache_dtype=kv)  # fmt: skip
    for r in records:
        want = r["output_ids_ignore_eos_48"]
        got = greedy(runner, r["prompt_ids"], len(want), list(range(16)))
        assert got == want, (
            f"{r['prompt']!r}: parted at step {next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)}"
        )

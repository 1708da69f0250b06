"""Each served architecture's tiny model (tests/data/arch/, made by transformers with
tests/fixtures/make_arch_fixtures.py) in every form the engine reads gives transformers' logits
and greedy continuations: prefill at once and in chunks, decode, and a batch of mixed rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import ml_dtypes  # noqa: F401 (bfloat16 for numpy)
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from enginecore.batch import Batch, SeqChunk
from enginecore.loader import safetensors as st_loader
from enginecore.model_runner import ModelRunner
from enginecore.weights import DenseMatrix
from tests.fixtures import arch_gguf, reference
from tests.unit.test_model import greedy, prefill, runner_for

ARCH = Path(__file__).resolve().parents[1] / "data" / "arch"
NAMES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]
Q = gguf.GGMLQuantizationType
# dense forms hold the same numbers: Hugging Face BF16 (as committed), F16, F32; GGUF F32, F16
DENSE_FORMS = ["hf_bf16", "hf_f16", "hf_f32", "gguf_f32", "gguf_f16"]
# exact numerics on dense weights: float32 arithmetic against transformers' float32
EXACT_ATOL = 2e-6  # times the largest |logit|
# int16 numerics against exact ones on the same Q8_0 weights (measured: up to 1.8e-4)
INT16_ATOL = 5e-4  # times the largest |logit|
# a Q8_0 twin in exact numerics against transformers on the unrounded weights (up to 0.052)
Q8_0_ATOL = 0.08  # times the largest |logit|


def logits_data(arch: str) -> dict[str, np.ndarray]:
    with np.load(ARCH / arch / "logits.npz") as data:
        return dict(data)


def sequences(arch: str) -> list[tuple[list[int], np.ndarray]]:
    data = logits_data(arch)
    n = sum(1 for k in data if k.startswith("ids_"))
    return [(data[f"ids_{i}"].tolist(), data[f"logits_{i}"]) for i in range(n)]


def hf_copy(src: Path, out: Path, dtype: type) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", out / "config.json")
    state = load_file(src / "model.safetensors")
    save_file({k: v.astype(dtype) for k, v in state.items()}, str(out / "model.safetensors"))
    return out


def forms_in(root: Path) -> dict[tuple[str, str], Path]:
    """Every form of every architecture's model, written under `root`."""
    out: dict[tuple[str, str], Path] = {}
    for arch in NAMES:
        src = ARCH / arch
        out[arch, "hf_bf16"] = src
        out[arch, "hf_f16"] = hf_copy(src, root / f"{arch}-f16", np.float16)
        out[arch, "hf_f32"] = hf_copy(src, root / f"{arch}-f32", np.float32)
        for name, qtype in (("gguf_f32", Q.F32), ("gguf_f16", Q.F16), ("gguf_q8_0", Q.Q8_0)):
            out[arch, name] = arch_gguf.write_twin(src, root / f"{arch}-{name}.gguf", qtype)
    return out


@pytest.fixture(scope="module")
def forms(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    return forms_in(tmp_path_factory.mktemp("arch"))


def test_committed_checkpoints_are_bf16() -> None:
    for arch in NAMES:
        state = load_file(ARCH / arch / "model.safetensors")
        assert {str(v.dtype) for v in state.values()} == {"bfloat16"}, arch


@pytest.mark.parametrize("arch", NAMES)
def test_reference_equals_transformers(arch: str) -> None:
    """The float64 oracle agrees with transformers on every architecture."""
    cfg, state = reference.state_from_hf(ARCH / arch)
    for ids, want in sequences(arch):
        got, _ = reference.forward(cfg, state, ids)
        np.testing.assert_allclose(got, want, rtol=0, atol=EXACT_ATOL * np.abs(want).max())


@pytest.mark.parametrize("form", DENSE_FORMS)
@pytest.mark.parametrize("arch", NAMES)
def test_prefill_logits_equal_transformers(
    forms: dict[tuple[str, str], Path], arch: str, form: str
) -> None:
    runner = runner_for(forms[arch, form], num_blocks=64)
    for ids, want in sequences(arch):
        atol = EXACT_ATOL * np.abs(want).max()
        for chunk in (len(ids), 5, 1):  # at once (BLAS rows), in chunks, token by token
            got = prefill(runner, ids, list(range(16)), chunk)
            np.testing.assert_allclose(got, want, rtol=0, atol=atol, err_msg=f"chunk {chunk}")
            assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("form", ["hf_bf16", "gguf_f32"])
@pytest.mark.parametrize("arch", NAMES)
def test_greedy_continuations_equal_transformers(
    forms: dict[tuple[str, str], Path], arch: str, form: str
) -> None:
    data = logits_data(arch)
    runner = runner_for(forms[arch, form], num_blocks=64)
    for i in range(len(sequences(arch))):
        want = data[f"greedy_{i}"].tolist()
        assert greedy(runner, data[f"prompt_{i}"].tolist(), len(want), list(range(16))) == want


@pytest.mark.parametrize("form", ["hf_bf16", "gguf_f16"])
@pytest.mark.parametrize("arch", NAMES)
def test_batch_of_mixed_rows_equals_transformers(
    forms: dict[tuple[str, str], Path], arch: str, form: str
) -> None:
    """One step: a whole prefill, a chunk after a cached prefix, and a decode, side by side."""
    runner = runner_for(forms[arch, form], num_blocks=64)
    (a, la), (b, lb), (c, lc) = sequences(arch)
    tables = [list(range(8)), list(range(8, 24)), list(range(24, 40))]
    prefill(runner, b[:11], tables[1], 11)  # b has 11 cached tokens, c all but its last
    prefill(runner, c[:-1], tables[2], 64)
    chunks = [
        SeqChunk(a, 0, tables[0], 1),
        SeqChunk(b[11:], 11, tables[1], 1),
        SeqChunk(c[-1:], len(c) - 1, tables[2], 1),
    ]
    got = runner.run(Batch.build(chunks, runner.block_size))
    want = np.stack([la[-1], lb[-1], lc[-1]])
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT_ATOL * np.abs(want).max())


@pytest.mark.parametrize("arch", NAMES)
def test_int16_numerics_on_a_q8_0_twin_stay_within_the_bounds(
    forms: dict[tuple[str, str], Path], arch: str
) -> None:
    """The default numerics against exact ones on the same Q8_0 weights, and both against
    transformers (there Q8_0's rounding of the weights dominates)."""
    exact = runner_for(forms[arch, "gguf_q8_0"], num_blocks=64)
    int16 = runner_for(forms[arch, "gguf_q8_0"], num_blocks=64, numerics="int16")
    for ids, want in sequences(arch):
        a, b = (prefill(r, ids, list(range(16)), 4) for r in (exact, int16))
        scale = np.abs(want).max()
        assert np.abs(b - a).max() <= INT16_ATOL * scale
        assert (b.argmax(-1) == a.argmax(-1)).all()
        assert np.abs(a - want).max() <= Q8_0_ATOL * scale


@pytest.mark.parametrize("arch", NAMES)
def test_hub_and_transformers5_configs_read_alike(arch: str, tmp_path: Path) -> None:
    """The Hub's config style (rope_theta, rope_scaling, sliding_window_pattern) and the one
    transformers 5 writes (rope_parameters, layer_types) give the same model."""
    (tmp_path / "config.json").write_text((ARCH / arch / "config-transformers5.json").read_text())
    assert st_loader.read_config(tmp_path) == st_loader.read_config(ARCH / arch)


def test_gemma3_layers_interleave_windows_and_rope_bases() -> None:
    cfg, _ = st_loader.read_config(ARCH / "gemma3")
    assert cfg.layer_window == (8, 8, 0)
    assert [(r.theta, r.linear) for r in cfg.layer_rope] == [(1e4, 1.0), (1e4, 1.0), (1e6, 8.0)]
    assert (cfg.embed_scale, cfg.final_softcap, cfg.activation) == (8.0, 30.0, "gelu_tanh")


def test_gemma3_query_scalar_other_than_head_dim(tmp_path: Path) -> None:
    """query_pre_attn_scalar (Gemma 3 27B's differs from its head size) scales the queries."""
    model = hf_copy(ARCH / "gemma3", tmp_path / "g", np.float32)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "query_pre_attn_scalar": 20}))
    cfg, state = reference.state_from_hf(model)
    ids, transformers_logits = sequences("gemma3")[1]
    want, _ = reference.forward(cfg, state, ids)
    assert np.abs(want - transformers_logits).max() > 0.1  # the scalar matters
    got = prefill(runner_for(model, num_blocks=64), ids, list(range(16)), 7)
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT_ATOL * np.abs(want).max())


def test_bf16_load_reads_the_same_numbers_as_f32(forms: dict[tuple[str, str], Path]) -> None:
    a = ModelRunner.from_path(forms["qwen3", "hf_bf16"], 4, 4, 0, 64).weights
    b = ModelRunner.from_path(forms["qwen3", "hf_f32"], 4, 4, 0, 64).weights
    assert isinstance(a.lm_head, DenseMatrix) and isinstance(b.lm_head, DenseMatrix)
    np.testing.assert_array_equal(a.lm_head.panels, b.lm_head.panels)
    np.testing.assert_array_equal(a.final_norm, b.final_norm)


# int8 numerics (llama.cpp's activations) against exact ones on the same Q8_0 weights, measured:
# mean KL 1e-7 (gemma3) to 4.9e-3 (llama), top-1 agreement 64-67 of 67 rows
INT8_MEAN_KL = 0.02
INT8_TOP1 = 0.9


@pytest.mark.parametrize("arch", NAMES)
def test_int8_numerics_on_a_q8_0_twin_stay_close_to_exact(
    forms: dict[tuple[str, str], Path], arch: str
) -> None:
    exact = runner_for(forms[arch, "gguf_q8_0"], num_blocks=64)
    int8 = runner_for(forms[arch, "gguf_q8_0"], num_blocks=64, numerics="int8")
    kl, top1 = [], []
    for ids, _ in sequences(arch):
        a, b = (prefill(r, ids, list(range(16)), 4).astype(np.float64) for r in (exact, int8))
        la = a - a.max(-1, keepdims=True)
        la -= np.log(np.exp(la).sum(-1, keepdims=True))
        lb = b - b.max(-1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
        kl.extend((np.exp(la) * (la - lb)).sum(-1))
        top1.extend(a.argmax(-1) == b.argmax(-1))
    assert np.mean(kl) <= INT8_MEAN_KL
    assert np.mean(top1) >= INT8_TOP1  # over all rows: one short sequence alone may miss 1 of 7

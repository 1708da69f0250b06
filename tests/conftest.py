"""Session fixtures: the tiny models (generated once per run) and the bundled model if present."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

from shared.config import BUNDLED_MODEL
from tests.fixtures import llama_cpp_data
from tests.fixtures import tiny_model as tm

SUCC_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


class TinyModels(NamedTuple):
    hf: Path  # random llama, Hugging Face directory (no chat template: the default one)
    gguf_f32: Path  # the same weights as F32 GGUF
    gguf_quant: Path  # the same weights quantized like the bundled model (Q8_0 + Q4_1)
    succ: Path  # the succ model (after byte i comes byte i + 1), Hugging Face directory
    gguf_q8_0: Path  # a wider model (K-quant rows), every matrix Q8_0
    gguf_q4_k_m: Path  # the same shape in a Q4_K_M-like mix (Q4_K, Q5_K, Q6_K, Q5_0)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    root = tmp_path_factory.mktemp("models")
    spec = tm.TinySpec()
    state = tm.random_state(spec)
    succ = tm.succ_state(tm.SUCC)
    wide = tm.random_state(tm.KQUANT, seed=3)
    return TinyModels(
        hf=tm.write_hf(root / "tiny", spec, state, None),
        gguf_f32=tm.write_gguf(root / "tiny-f32.gguf", spec, state, None, None),
        gguf_quant=tm.write_gguf(root / "tiny-q.gguf", spec, state, tm.BUNDLED_MIX, None),
        succ=tm.write_hf(root / "succ", tm.SUCC, succ, SUCC_TEMPLATE),
        gguf_q8_0=tm.write_gguf(root / "tiny-q8_0.gguf", tm.KQUANT, wide, tm.Q8_0_MIX, None),
        gguf_q4_k_m=tm.write_gguf(root / "tiny-q4_k_m.gguf", tm.KQUANT, wide, tm.Q4_K_M_MIX, None),
    )


def missing_bundled_model(path: Path) -> None:
    """Skip a test that needs the bundled model on a machine without it; under CI, fail."""
    message = f"bundled model not fetched ({path}); `make model` fetches it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_llama_cpp_data() -> Path:
    """llama.cpp's vocabularies and templates (`make testdata`); skipped without, failed under CI."""
    if not (llama_cpp_data.ROOT / "COMPLETE").is_file():
        message = f"llama.cpp test data not extracted ({llama_cpp_data.ROOT}); `make testdata`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return llama_cpp_data.MODELS


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    path = Path(BUNDLED_MODEL).expanduser()
    if not path.exists():
        missing_bundled_model(path)
    return path

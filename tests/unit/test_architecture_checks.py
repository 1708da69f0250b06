"""What the loaders refuse, naming it, before any tensor data is read: an unknown architecture
or RoPE type, a missing tensor, a shape the config does not imply, a tensor no architecture
reads, an unserved dtype."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from enginecore import loader
from enginecore.loader import gguf as gguf_loader
from enginecore.weights import Numerics
from tests.fixtures import arch_gguf

ARCH = Path(__file__).resolve().parents[1] / "data" / "arch"


def load(path: Path) -> None:
    loader.load(path, Numerics.EXACT)


def twin(tmp_path: Path, model: str, **kw: object) -> Path:
    return arch_gguf.write_twin(ARCH / model, tmp_path / f"{model}.gguf", **kw)  # type: ignore[arg-type]


def hf(
    tmp_path: Path,
    arch: str,
    config: Callable[[dict[str, object]], dict[str, object]] = lambda c: c,
    tensors: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = lambda t: t,
) -> Path:
    out = tmp_path / arch
    out.mkdir()
    c = json.loads((ARCH / arch / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config(c)))
    state = {
        k: v.astype(np.float32) for k, v in load_file(ARCH / arch / "model.safetensors").items()
    }
    save_file(tensors(state), str(out / "model.safetensors"))
    return out


@pytest.fixture
def no_data_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading any tensor's data fails the test: refusals must come from the header."""

    def fail(*args: object) -> None:
        raise AssertionError("tensor data read before the shapes were checked")

    monkeypatch.setattr(gguf_loader, "_part", fail)


def transposed(target: str) -> arch_gguf.Edit:
    return lambda name, a: a.T.copy() if name == target else a


def dropped(target: str) -> arch_gguf.Edit:
    return lambda name, a: None if name == target else a


GGUF_CASES = [
    ("qwen3", {"edit": dropped("blk.1.attn_k_norm.weight")},
     "missing tensor blk.1.attn_k_norm.weight (expected shape (32,))"),
    ("qwen2", {"edit": dropped("blk.0.attn_v.bias")}, "missing tensor blk.0.attn_v.bias"),
    ("gemma3", {"edit": dropped("blk.2.post_ffw_norm.weight")},
     "missing tensor blk.2.post_ffw_norm.weight"),
    ("qwen3", {"edit": transposed("blk.0.attn_q.weight")},
     "tensor blk.0.attn_q.weight has shape (64, 128), but the model's config implies (128, 64)"),
    ("llama", {"edit": lambda n, a: a[:-1] if n == "token_embd.weight" else a},
     "tensor token_embd.weight has shape (319, 64), but the model's config implies (320, 64)"),
    ("gemma3", {"edit": lambda n, a: a[:16] if n == "blk.0.attn_q_norm.weight" else a},
     "tensor blk.0.attn_q_norm.weight has shape (16,), but the model's config implies (32,)"),
    ("llama", {"edit": lambda n, a: a[:4] if n == "rope_freqs.weight" else a},
     "tensor rope_freqs.weight has shape (4,), but the model's config implies (8,)"),
    ("qwen3", {"extra": lambda w: w.add_tensor("blk.0.attn_qkv.weight", np.zeros((4, 64), np.float32))},
     "tensor blk.0.attn_qkv.weight is not part of this architecture"),
    ("llama", {"arch": "mamba"}, "unsupported architecture 'mamba': served are llama, qwen2"),
    ("llama", {"extra": lambda w: w.add_string("llama.rope.scaling.type", "yarn")},
     "llama.rope.scaling.type 'yarn' is not served"),
    ("qwen2", {"extra": lambda w: w.add_sliding_window(64)},
     "qwen2.attention.sliding_window: sliding windows of qwen2 are not served"),
    ("qwen3", {"extra": lambda w: w.add_rope_dimension_count(16)},
     "qwen3.rope.dimension_count = 16 differs from the head size 32"),
    ("phi3", {"edit": dropped("blk.1.attn_qkv.weight")},
     "missing tensor blk.1.attn_qkv.weight (expected shape (128, 64))"),
    ("phi3", {"edit": lambda n, a: a[:128] if n == "blk.0.ffn_up.weight" else a},
     "tensor blk.0.ffn_up.weight has shape (128, 64), but the model's config implies (256, 64)"),
    ("phi3", {"extra": lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)},
     "phi3.rope.scaling.type 'longrope' is not served"),
]  # fmt: skip


@pytest.mark.parametrize(("arch", "kw", "message"), GGUF_CASES)
@pytest.mark.usefixtures("no_data_read")
def test_gguf_refused_from_its_header(
    tmp_path: Path, arch: str, kw: dict[str, object], message: str
) -> None:
    path = twin(tmp_path, arch, **kw)
    with pytest.raises(ValueError, match=re.escape(message)):
        load(path)


def test_gguf_twin_loads_when_untouched(tmp_path: Path) -> None:
    """The cases above fail for their corruption, not for the twin itself."""
    for arch in ("llama", "qwen2", "qwen3", "gemma3", "phi3"):
        load(twin(tmp_path, arch))


def _set(key: str, value: object) -> Callable[[dict[str, object]], dict[str, object]]:
    return lambda c: {**c, key: value}


def _without(name: str) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    return lambda t: {k: v for k, v in t.items() if k != name}


def _with(name: str, a: np.ndarray) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    return lambda t: {**t, name: a}


HF_CASES = [
    ("llama", {"config": _set("model_type", "mamba")},
     "unsupported model_type 'mamba': served are llama, qwen2, qwen3, gemma3"),
    ("llama", {"config": _set("rope_scaling", {"rope_type": "yarn", "factor": 4.0})},
     "rope type 'yarn' is not served"),
    ("qwen2", {"config": _set("use_sliding_window", True)}, "use_sliding_window of qwen2"),
    ("llama", {"config": _set("attention_bias", True)}, "attention_bias = True of llama"),
    ("gemma3", {"config": _set("attn_logit_softcapping", 50.0)}, "attn_logit_softcapping = 50.0"),
    ("llama", {"config": _set("hidden_act", "gelu")}, "llama with activation 'gelu'"),
    ("qwen3", {"tensors": _without("model.layers.1.self_attn.q_norm.weight")},
     "missing tensor model.layers.1.self_attn.q_norm.weight (expected shape (32,))"),
    ("qwen2", {"tensors": _with("model.layers.0.self_attn.k_proj.bias", np.zeros(8, np.float32))},
     "tensor model.layers.0.self_attn.k_proj.bias has shape (8,), but the model's config implies (32,)"),
    ("gemma3", {"tensors": _with("model.layers.0.mlp.fused.weight", np.zeros(4, np.float32))},
     "tensor model.layers.0.mlp.fused.weight is not part of this architecture"),
    ("phi3", {"config": _set("rope_scaling", {"rope_type": "longrope", "short_factor": [1.0] * 8,
                                               "long_factor": [2.0] * 8})},
     "rope type 'longrope' is not served"),
    ("phi3", {"config": _set("partial_rotary_factor", 0.75)}, "partial_rotary_factor is not served"),
    ("phi3", {"tensors": _without("model.layers.0.mlp.gate_up_proj.weight")},
     "missing tensor model.layers.0.mlp.gate_up_proj.weight (expected shape (256, 64))"),
    ("llama", {"tensors": _with("model.norm.weight", np.zeros(64, np.int32))},
     "tensor model.norm.weight is I32"),
]  # fmt: skip


@pytest.mark.parametrize(("arch", "kw", "message"), HF_CASES)
def test_hf_checkpoint_refused_naming_what(
    tmp_path: Path, arch: str, kw: dict[str, object], message: str
) -> None:
    path = hf(tmp_path, arch, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(message)):
        load(path)


def test_hf_harmless_extras_are_ignored(tmp_path: Path) -> None:
    """RoPE tables old checkpoints carry, and a saved head the config ties anyway."""
    inv_freq = "model.layers.0.self_attn.rotary_emb.inv_freq"

    def extras(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            **t,
            inv_freq: np.zeros(8, np.float32),
            "lm_head.weight": t["model.embed_tokens.weight"],
        }

    load(hf(tmp_path, "llama", tensors=extras))

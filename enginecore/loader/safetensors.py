"""Hugging Face llama checkpoints: config.json + *.safetensors (read with the safetensors package)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

from enginecore.model import ModelConfig
from enginecore.weights import F32, DenseMatrix, LayerWeights, Numerics, Weights, fuse


def read_config(model_dir: Path) -> ModelConfig:
    try:
        c = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{model_dir}/config.json: {e}") from e
    if c.get("model_type", "llama") != "llama":
        raise ValueError(f"unsupported model_type {c.get('model_type')!r}: only llama is served")
    if c.get("rope_scaling"):
        raise ValueError("rope_scaling is not supported")
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    return ModelConfig(
        vocab_size=int(c["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads", heads)),
        head_dim=int(c.get("head_dim") or hidden // heads),
        rope_theta=float(c.get("rope_theta", 10000.0)),
        rms_eps=float(c.get("rms_norm_eps", 1e-5)),
        max_position=int(c.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def load(model_dir: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    cfg = read_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors files")
    arrays: dict[str, F32] = {}
    for f in files:
        with safe_open(f, framework="numpy") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                arrays[name] = np.asarray(st.get_tensor(name), dtype=np.float32)

    def take(name: str) -> F32:
        if name not in arrays:
            raise ValueError(f"{model_dir}: missing tensor {name}")
        return arrays[name]

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        qkv = [take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
        gate_up = [take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
        layers.append(
            LayerWeights(
                attn_norm=take(p + "input_layernorm.weight"),
                wqkv=fuse(qkv, numerics),
                wo=DenseMatrix(take(p + "self_attn.o_proj.weight")),
                ffn_norm=take(p + "post_attention_layernorm.weight"),
                w_gate_up=fuse(gate_up, numerics),
                w_down=DenseMatrix(take(p + "mlp.down_proj.weight")),
            )
        )
    embed = DenseMatrix(take("model.embed_tokens.weight"))
    lm_head = embed if cfg.tie_embeddings else DenseMatrix(take("lm_head.weight"))
    return cfg, Weights(embed, layers, take("model.norm.weight"), lm_head, numerics)

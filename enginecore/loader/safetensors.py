"""Hugging Face checkpoints: config.json + *.safetensors, read with the safetensors package.

F32, F16 and BF16 tensors are served; importing ml_dtypes gives numpy the bfloat16 type that
safetensors' numpy backend needs for BF16 (the Hub's usual dtype), in `load` only: the import
takes ~1 s, which a core serving a GGUF would pay at every start. Shapes and dtypes come from
the files' headers and are checked against the config before any tensor is read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from enginecore.loader import architectures
from enginecore.loader.architectures import Family
from enginecore.model import ModelConfig, Rope
from enginecore.weights import F32, Numerics, Weights

DTYPES = ("F32", "F16", "BF16")


def _rope(params: dict[str, Any], head_dim: int, where: str) -> Rope:
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", 10000.0))
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor is not served")
    if kind == "default":
        return Rope(theta)
    if kind == "linear":
        return Rope(theta, linear=float(params["factor"]))
    if kind == "llama3":
        factors = architectures.llama3_factors(
            theta, head_dim, float(params["factor"]), float(params["low_freq_factor"]),
            float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]),
        )  # fmt: skip
        return Rope(theta, factors)
    raise ValueError(f"{where}: rope type {kind!r} is not served (default, linear, llama3)")


def _ropes(c: dict[str, Any], head_dim: int) -> tuple[Rope, Rope]:
    """(full-attention layers' RoPE, sliding layers' RoPE), from either config style:
    rope_theta + rope_scaling, or rope_parameters (per layer type where they differ)."""
    params = c.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention", {}), params.get("sliding_attention", {})
    else:
        full = {
            "rope_theta": c.get("rope_theta", 10000.0),
            **params,
            **(c.get("rope_scaling") or {}),
        }
        local = {"rope_theta": c.get("rope_local_base_freq", 10000.0)}
    if "partial_rotary_factor" in c:
        full = {**full, "partial_rotary_factor": c["partial_rotary_factor"]}
    return _rope(full, head_dim, "rope"), _rope(local, head_dim, "sliding-window layers' rope")


def _sliding(c: dict[str, Any], fam: Family, num_layers: int) -> list[bool]:
    types = c.get("layer_types")
    if types is None and fam.window_everywhere:
        return [bool(c.get("sliding_window"))] * num_layers
    if types is None and fam.gguf_arch == "gemma3":
        return architectures.sliding_layers(num_layers, int(c.get("sliding_window_pattern", 6)))
    if types is None:
        if c.get("use_sliding_window"):
            raise ValueError(f"use_sliding_window of {fam.hf_model_type} is not served")
        return [False] * num_layers
    if len(types) != num_layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types {types} are not served (full_attention, sliding_attention)")
    return [t == "sliding_attention" for t in types]


def read_config(model_dir: Path) -> tuple[ModelConfig, Family]:
    try:
        c = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{model_dir}/config.json: {e}") from e
    fam = architectures.family(str(c.get("model_type", "llama")), gguf=False)
    act = c.get("hidden_activation") or c.get("hidden_act", "silu")
    if act != fam.hf_activation:
        raise ValueError(f"{fam.hf_model_type} with activation {act!r} is not served")
    for key in ("mlp_bias", "attn_logit_softcapping"):
        if c.get(key):
            raise ValueError(f"{key} = {c[key]} is not served")
    if c.get("attention_bias", fam.qkv_bias) != fam.qkv_bias:
        raise ValueError(
            f"attention_bias = {c['attention_bias']} of {fam.hf_model_type} is not served"
        )
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    layers = int(c["num_hidden_layers"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    full_rope, local_rope = _ropes(c, head_dim)
    cfg = architectures.make_config(
        fam,
        vocab=int(c["vocab_size"]),
        hidden=hidden,
        ffn=int(c["intermediate_size"]),
        layers=layers,
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        eps=float(c.get("rms_norm_eps", 1e-5)),
        max_position=int(c.get("max_position_embeddings", 2048)),
        tied=bool(c.get("tie_word_embeddings", fam.hf_tied_default)),
        full_rope=full_rope,
        local_rope=local_rope,
        sliding=_sliding(c, fam, layers),
        window=int(c.get("sliding_window") or 0),
        query_scale=1 / math.sqrt(float(c.get("query_pre_attn_scalar") or head_dim)),
        final_softcap=float(c.get("final_logit_softcapping") or 0.0),
    )
    return cfg, fam


def _harmless(tied: bool) -> Any:
    def harmless(name: str) -> bool:
        # RoPE tables some checkpoints carry; a head the config ties to the embedding anyway
        return name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")

    return harmless


def load(model_dir: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    cfg, fam = read_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors files")
    shapes: dict[str, tuple[int, ...]] = {}
    file_of: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(f, framework="numpy") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    header = st.get_slice(name)
                    if name in shapes:
                        raise ValueError(f"{f}: tensor {name} is also in {file_of[name]}")
                    if header.get_dtype() not in DTYPES:
                        raise ValueError(
                            f"{f}: tensor {name} is {header.get_dtype()} (served: {DTYPES})"
                        )
                    shapes[name], file_of[name] = tuple(header.get_shape()), f
        except ValueError:
            raise
        except Exception as e:  # the package's own errors: a file it cannot parse
            raise ValueError(f"{f}: not a readable safetensors file: {e}") from e
    expected = {
        architectures.hf_name(name, fam): shape
        for name, shape in architectures.tensor_shapes(cfg, fam).items()
    }
    architectures.check_shapes(model_dir, expected, shapes, _harmless(cfg.tie_embeddings))
    import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy)

    arrays: dict[str, F32] = {}
    for f in files:
        with safe_open(f, framework="numpy") as st:
            for name in st.keys():  # noqa: SIM118
                if name in expected:
                    arrays[name] = np.asarray(st.get_tensor(name), dtype=np.float32)

    def tensor(name: str) -> F32:
        return arrays[architectures.hf_name(name, fam)]

    weights = architectures.build_weights(cfg, fam, numerics, tensor, tensor, fam.hf_norm_offset)
    return cfg, weights

"""The architectures served, as data: what sets each family apart, every tensor it needs with
the shape its config implies (checked against a file's header before any data is read), the
names a Hugging Face checkpoint gives them, and the one builder of Weights from either form.

Tensors are named as in GGUF files (llama.cpp's names); `hf_name` maps them to Hugging Face's.
Shapes are (rows, columns) = (out features, in features), as numpy holds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from enginecore.model import ModelConfig, Rope
from enginecore.weights import (
    F32,
    DenseMatrix,
    FusedMatrix,
    LayerWeights,
    Matrix,
    Numerics,
    PackedMatrix,
    Part,
    Weights,
    fuse,
)

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Family:
    gguf_arch: str  # general.architecture of its GGUF files
    hf_model_type: str  # model_type of its config.json
    hf_activation: str = "silu"  # hidden_act (or hidden_activation) its config.json must name
    activation: str = "silu"  # the engine's name of that activation (model.ACTIVATIONS)
    qkv_bias: bool = False  # q, k and v projections have biases
    qk_norm: bool = False  # an RMSNorm over each q and k head before RoPE
    post_norms: bool = False  # the attention and MLP outputs are normed before the residual add
    scaled_embedding: bool = False  # embedding rows multiplied by sqrt(hidden)
    hf_norm_offset: float = 0.0  # its checkpoints' norms hold w - this (Gemma: 1 + w)
    gguf_interleaved_qk: bool = False  # llama.cpp permuted the q/k rows for its interleaved RoPE
    hf_tied_default: bool = False  # tie_word_embeddings when config.json omits it
    fused: bool = False  # q/k/v stored as one matrix, and gate/up as one (Phi-3)
    window_everywhere: bool = False  # a sliding_window in the config applies to every layer


FAMILIES = (
    Family("llama", "llama", gguf_interleaved_qk=True),
    Family("qwen2", "qwen2", qkv_bias=True),
    Family("qwen3", "qwen3", qk_norm=True),
    Family(
        "gemma3", "gemma3_text", hf_activation="gelu_pytorch_tanh", activation="gelu_tanh",
        qk_norm=True, post_norms=True, scaled_embedding=True, hf_norm_offset=1.0,
        hf_tied_default=True,
    ),
    Family("phi3", "phi3", fused=True, window_everywhere=True),
)  # fmt: skip
SERVED = ", ".join(f.gguf_arch for f in FAMILIES)


def family(name: str, gguf: bool) -> Family:
    """The family of a GGUF general.architecture (gguf) or a config.json model_type."""
    for f in FAMILIES:
        if name == (f.gguf_arch if gguf else f.hf_model_type):
            return f
    what = "architecture" if gguf else "model_type"
    raise ValueError(f"unsupported {what} {name!r}: served are {SERVED}")


def sliding_layers(num_layers: int, pattern: int) -> list[bool]:
    """Gemma's interleaving: of every `pattern` layers, the last attends globally."""
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(num_layers)]


def llama3_factors(
    theta: float, head_dim: int, factor: float, low: float, high: float, original: int
) -> tuple[float, ...]:
    """Llama 3's RoPE scaling as per-frequency divisors: long wavelengths divided by `factor`,
    short ones kept, those between blended (what GGUF's rope_freqs.weight holds)."""
    out = []
    for i in range(head_dim // 2):
        wavelen = 2 * math.pi * theta ** (2 * i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def make_config(
    fam: Family,
    *,
    vocab: int,
    hidden: int,
    ffn: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    max_position: int,
    tied: bool,
    full_rope: Rope,
    local_rope: Rope,
    sliding: list[bool],
    window: int,
    query_scale: float,
    final_softcap: float,
) -> ModelConfig:
    """The ModelConfig of a family's model: sliding layers get `window` and `local_rope`
    (the one RoPE of a family whose every layer may slide)."""
    if fam.window_everywhere:
        local_rope = full_rope
    if any(sliding) and window <= 0:
        raise ValueError(f"{fam.gguf_arch}: sliding-window layers without a window size")
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rms_eps=eps,
        max_position=max_position, tie_embeddings=tied,
        layer_rope=tuple(local_rope if s else full_rope for s in sliding),
        layer_window=tuple(window if s else 0 for s in sliding),
        query_scale=query_scale, activation=fam.activation,
        embed_scale=math.sqrt(hidden) if fam.scaled_embedding else 1.0,
        final_softcap=final_softcap,
    )  # fmt: skip


def tensor_shapes(cfg: ModelConfig, fam: Family) -> dict[str, Shape]:
    """Every tensor the model needs, GGUF-named, with the shape its config implies."""
    d, hd, ffn, q, kv = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim
    shapes: dict[str, Shape] = {
        "token_embd.weight": (cfg.vocab_size, d),
        "output_norm.weight": (d,),
    }
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, d)
    layer: dict[str, Shape] = {
        "attn_norm.weight": (d,), "attn_q.weight": (q, d), "attn_k.weight": (kv, d),
        "attn_v.weight": (kv, d), "attn_output.weight": (d, q), "ffn_norm.weight": (d,),
        "ffn_gate.weight": (ffn, d), "ffn_up.weight": (ffn, d), "ffn_down.weight": (d, ffn),
    }  # fmt: skip
    if fam.fused:
        for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight"):
            del layer[name]
        layer |= {"attn_qkv.weight": (q + 2 * kv, d), "ffn_up.weight": (2 * ffn, d)}
    if fam.qkv_bias:
        layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    if fam.qk_norm:
        layer |= {"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)}
    if fam.post_norms:
        layer |= {"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)}
    for i in range(cfg.num_layers):
        shapes |= {f"blk.{i}.{name}": shape for name, shape in layer.items()}
    return shapes


_HF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_HF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_output": "self_attn.o_proj",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}  # fmt: skip


def hf_name(name: str, fam: Family) -> str:
    """The Hugging Face name of a GGUF-named tensor."""
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    _, layer, kind, suffix = name.split(".")
    hf = _HF_LAYER[kind]
    if kind == "ffn_norm" and fam.post_norms:  # there, post_attention_layernorm is the other one
        hf = "pre_feedforward_layernorm"
    if kind == "ffn_up" and fam.fused:
        hf = "mlp.gate_up_proj"
    return f"model.layers.{layer}.{hf}.{suffix}"


def check_shapes(
    where: object,
    expected: Mapping[str, Shape],
    found: Mapping[str, Shape],
    harmless: Callable[[str], bool],
) -> None:
    """Every expected tensor present with its shape, and no tensor nobody would read (unless
    known to be harmless); refused naming the tensor, with the expected and found shapes."""
    for name, shape in expected.items():
        if name not in found:
            raise ValueError(f"{where}: missing tensor {name} (expected shape {shape})")
        if tuple(found[name]) != shape:
            raise ValueError(
                f"{where}: tensor {name} has shape {tuple(found[name])}, but the model's "
                f"config implies {shape}"
            )
    extra = sorted(n for n in found if n not in expected and not harmless(n))
    if extra:
        raise ValueError(
            f"{where}: tensor {extra[0]} is not part of this architecture "
            f"({len(extra)} unknown tensors)"
        )


def build_weights(
    cfg: ModelConfig,
    fam: Family,
    numerics: Numerics,
    matrix: Callable[[str], Part],
    vector: Callable[[str], F32],
    norm_offset: float,
) -> Weights:
    """Weights from GGUF-named tensors: matrix(name) gives a matrix's rows (q and k in
    rotate-half order), vector(name) a 1-D tensor; norm_offset is added to every norm."""

    def norm(name: str) -> F32:
        return vector(name) + np.float32(norm_offset)

    def fused(*names: str) -> Matrix:
        return fuse([matrix(n) for n in names], numerics)

    layers = []
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        qkv = ["attn_qkv"] if fam.fused else ["attn_q", "attn_k", "attn_v"]
        gate_up = ["ffn_up"] if fam.fused else ["ffn_gate", "ffn_up"]  # fused: [gate; up]
        lw = LayerWeights(
            attn_norm=norm(p + "attn_norm.weight"),
            wqkv=fused(*(f"{p}{n}.weight" for n in qkv)),
            wo=fused(p + "attn_output.weight"),
            ffn_norm=norm(p + "ffn_norm.weight"),
            w_gate_up=fused(*(f"{p}{n}.weight" for n in gate_up)),
            w_down=fused(p + "ffn_down.weight"),
        )
        if fam.qkv_bias:
            lw.qkv_bias = np.concatenate([vector(p + f"attn_{x}.bias") for x in "qkv"])
        if fam.qk_norm:
            lw.q_norm, lw.k_norm = norm(p + "attn_q_norm.weight"), norm(p + "attn_k_norm.weight")
        if fam.post_norms:
            lw.post_attn_norm = norm(p + "post_attention_norm.weight")
            lw.post_ffn_norm = norm(p + "post_ffw_norm.weight")
        layers.append(lw)
    embed = _single(fused("token_embd.weight"))
    lm_head = embed if cfg.tie_embeddings else _single(fused("output.weight"))
    return Weights(embed, layers, norm("output_norm.weight"), lm_head, numerics)


def _single(m: Matrix) -> DenseMatrix | PackedMatrix:
    assert not isinstance(m, FusedMatrix)
    return m

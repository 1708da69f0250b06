"""GGUF checkpoints via the `gguf` package: metadata -> ModelConfig, tensors -> Weights."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from enginecore.model import ModelConfig
from enginecore.weights import F32, LayerWeights, Matrix, Weights, concat_rows
from shared.gguf_file import gguf_reader

Q = gguf.GGMLQuantizationType


def _field(reader: gguf.GGUFReader, key: str, default: object = None) -> object:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader: gguf.GGUFReader) -> ModelConfig:
    arch = str(_field(reader, "general.architecture"))
    if arch != "llama":
        raise ValueError(f"unsupported architecture {arch!r}: only llama is served")

    def get(key: str, default: object = None) -> object:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(get("embedding_length"))  # type: ignore[call-overload]
    heads = int(get("attention.head_count"))  # type: ignore[call-overload]
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(get("vocab_size", len(tokens.data) if tokens else None))  # type: ignore[call-overload]
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),  # type: ignore[call-overload]
        num_layers=int(get("block_count")),  # type: ignore[call-overload]
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),  # type: ignore[call-overload]
        head_dim=int(get("rope.dimension_count", hidden // heads)),  # type: ignore[call-overload]
        rope_theta=float(get("rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),  # type: ignore[arg-type]
        max_position=int(get("context_length", 2048)),  # type: ignore[call-overload]
        tie_embeddings="output.weight" not in names,
    )


def _f16(raw: npt.NDArray[np.uint8]) -> F32:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _matrix(t: gguf.ReaderTensor) -> Matrix:
    qtype = Q(t.tensor_type)
    data = np.asarray(t.data)
    if qtype == Q.F32:
        return Matrix.f32(data.reshape(data.shape[0], -1))
    if qtype in (Q.F16, Q.BF16):
        return Matrix.f32(gguf.quants.dequantize(data, qtype))
    rows = data.shape[0]
    if qtype == Q.Q8_0:
        blocks = data.reshape(rows, -1, 34)
        d = _f16(blocks[:, :, 0:2]).reshape(rows, -1)
        qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, -1)
        return Matrix.q8_0(qs, d)
    if qtype == Q.Q4_1:
        blocks = data.reshape(rows, -1, 20)
        d = _f16(blocks[:, :, 0:2]).reshape(rows, -1)
        m = _f16(blocks[:, :, 2:4]).reshape(rows, -1)
        qs4 = np.ascontiguousarray(blocks[:, :, 4:]).reshape(rows, -1).astype(np.uint8)
        return Matrix.q4_1(qs4, d, m)
    raise ValueError(
        f"tensor {t.name}: GGUF type {qtype.name} is not served (F32, F16, BF16, Q8_0, Q4_1)"
    )


def _vector(t: gguf.ReaderTensor) -> F32:
    return _matrix(t).dense.reshape(-1)


def unpermute_rows(num_rows: int, n_head: int) -> npt.NDArray[np.intp]:
    """Row order that undoes llama.cpp's q/k permutation (back to HF rotate-half order)."""
    perm = (
        np.arange(num_rows).reshape(n_head, 2, num_rows // n_head // 2).swapaxes(1, 2).reshape(-1)
    )
    return np.argsort(perm)


def load(path: Path) -> tuple[ModelConfig, Weights]:
    reader = gguf_reader(path)
    cfg = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def take(name: str) -> gguf.ReaderTensor:
        if name not in tensors:
            raise ValueError(f"{path}: missing tensor {name}")
        return tensors[name]

    layers = []
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        wq = _matrix(take(p + "attn_q.weight")).take_rows(unpermute_rows(cfg.q_dim, cfg.num_heads))
        wk = _matrix(take(p + "attn_k.weight")).take_rows(
            unpermute_rows(cfg.kv_dim, cfg.num_kv_heads)
        )
        wv = _matrix(take(p + "attn_v.weight"))
        gate, up = _matrix(take(p + "ffn_gate.weight")), _matrix(take(p + "ffn_up.weight"))
        layers.append(
            LayerWeights(
                attn_norm=_vector(take(p + "attn_norm.weight")),
                wqkv=concat_rows([wq, wk, wv]),
                wo=_matrix(take(p + "attn_output.weight")),
                ffn_norm=_vector(take(p + "ffn_norm.weight")),
                w_gate_up=concat_rows([gate, up]),
                w_down=_matrix(take(p + "ffn_down.weight")),
            )
        )
    embed = _matrix(take("token_embd.weight"))
    lm_head = embed if cfg.tie_embeddings else _matrix(take("output.weight"))
    return cfg, Weights(embed, layers, _vector(take("output_norm.weight")), lm_head)

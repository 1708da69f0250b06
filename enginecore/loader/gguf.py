"""GGUF checkpoints via the `gguf` package: metadata -> ModelConfig, tensors -> Weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from enginecore.loader import gguf_types
from enginecore.model import ModelConfig
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


def _part(t: gguf.ReaderTensor, rows: npt.NDArray[np.intp] | None = None) -> Part:
    """A matrix tensor as fp32 (F32, F16, BF16) or its integer form, rows reordered."""
    qtype = Q(t.tensor_type)
    data = np.asarray(t.data)
    data = data.reshape(data.shape[0], -1) if data.ndim > 1 else data.reshape(1, -1)
    if rows is not None:
        data = data[rows]
    if qtype in gguf_types.DENSE:
        return _owned(gguf.quants.dequantize(data, qtype))
    if qtype not in gguf_types.DECODERS:
        raise ValueError(
            f"tensor {t.name}: GGUF type {qtype.name} is not served ({gguf_types.SERVED})"
        )
    return (qtype.name, gguf_types.decode(qtype, data))


def _vector(t: gguf.ReaderTensor) -> F32:
    qtype = Q(t.tensor_type)
    if qtype not in gguf_types.DENSE and qtype not in gguf_types.DECODERS:
        raise ValueError(
            f"tensor {t.name}: GGUF type {qtype.name} is not served ({gguf_types.SERVED})"
        )
    return _owned(gguf.quants.dequantize(np.asarray(t.data), qtype)).reshape(-1)


def _owned(a: npt.NDArray[Any]) -> F32:
    """fp32 in memory of its own: an F32 tensor comes back from gguf as a view of the file's
    mapping, and one such view kept every page of the file that the loader touched resident
    (the size of the file, on top of the weights)."""
    return np.array(a, np.float32, order="C", copy=True)


def unpermute_rows(num_rows: int, n_head: int) -> npt.NDArray[np.intp]:
    """Row order that undoes llama.cpp's q/k permutation (back to HF rotate-half order)."""
    perm = (
        np.arange(num_rows).reshape(n_head, 2, num_rows // n_head // 2).swapaxes(1, 2).reshape(-1)
    )
    return np.argsort(perm)


def load(path: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    reader = gguf_reader(path)
    cfg = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def take(name: str) -> gguf.ReaderTensor:
        if name not in tensors:
            raise ValueError(f"{path}: missing tensor {name}")
        return tensors[name]

    def matrix(*names: str, rows: list[npt.NDArray[np.intp] | None] | None = None) -> Matrix:
        order = rows or [None] * len(names)
        return fuse([_part(take(n), r) for n, r in zip(names, order, strict=True)], numerics)

    layers = []
    q_rows = unpermute_rows(cfg.q_dim, cfg.num_heads)
    k_rows = unpermute_rows(cfg.kv_dim, cfg.num_kv_heads)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=_vector(take(p + "attn_norm.weight")),
                wqkv=matrix(
                    p + "attn_q.weight",
                    p + "attn_k.weight",
                    p + "attn_v.weight",
                    rows=[q_rows, k_rows, None],
                ),
                wo=matrix(p + "attn_output.weight"),
                ffn_norm=_vector(take(p + "ffn_norm.weight")),
                w_gate_up=matrix(p + "ffn_gate.weight", p + "ffn_up.weight"),
                w_down=matrix(p + "ffn_down.weight"),
            )
        )
    embed = _single(matrix("token_embd.weight"))
    lm_head = embed if cfg.tie_embeddings else _single(matrix("output.weight"))
    final_norm = _vector(take("output_norm.weight"))
    # the weights own their memory now; the shared reader (cached for the metadata readers)
    # maps the file, and every page the loader read would stay resident with it: the size of
    # the file on top of the weights
    gguf_reader.cache_clear()
    return cfg, Weights(embed, layers, final_norm, lm_head, numerics)


def _single(m: Matrix) -> DenseMatrix | PackedMatrix:
    assert not isinstance(m, FusedMatrix)
    return m

"""GGUF checkpoints (shared/gguf_file.py's parse; the `gguf` package's types and dequantizers):
metadata -> ModelConfig, tensors -> Weights.

Metadata keys and tensor names are llama.cpp's for each architecture; where llama.cpp fixes a
value in code rather than in the file (Gemma 3's layer pattern and local RoPE base), its rule
is followed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from enginecore.loader import architectures, gguf_types
from enginecore.model import ModelConfig, Rope
from enginecore.weights import F32, Numerics, Part, Weights
from shared.gguf_file import GgufFile, GgufTensor, gguf_reader

Q = gguf.GGMLQuantizationType
ROPE_FREQS = "rope_freqs.weight"  # Llama 3's RoPE scaling: a divisor per frequency


def read_config(reader: GgufFile) -> ModelConfig:
    """The ModelConfig of a GGUF's metadata (and its rope_freqs.weight, Llama 3's scaling)."""
    arch = str(reader.value("general.architecture"))
    fam = architectures.family(arch, gguf=True)

    def get(key: str, default: object = None) -> Any:
        value = reader.value(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    layers = int(get("block_count"))
    head_dim = int(get("attention.key_length", get("rope.dimension_count", hidden // heads)))
    for key in ("attention.value_length", "rope.dimension_count"):
        if int(get(key, head_dim)) != head_dim:
            raise ValueError(f"{arch}.{key} = {get(key)} differs from the head size {head_dim}")
    tokens = reader.value("tokenizer.ggml.tokens", kind=list[str])
    tensors = {t.name: t for t in reader.tensors}
    scaling = str(get("rope.scaling.type", "none"))
    if scaling not in ("none", "linear"):
        raise ValueError(f"{arch}.rope.scaling.type {scaling!r} is not served (none, linear)")
    factor = float(get("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
    full_rope = Rope(
        float(get("rope.freq_base", 10000.0)), _rope_factors(tensors, head_dim), factor
    )
    window = int(get("attention.sliding_window", 0))
    if window and arch != "gemma3" and not fam.window_everywhere:
        raise ValueError(
            f"{arch}.attention.sliding_window: sliding windows of {arch} are not served"
        )
    # llama.cpp's rules for Gemma 3: every 6th layer global unless the file says otherwise, a
    # local RoPE base of 10000, and queries scaled by 1 / sqrt(head_dim) except for 27B
    pattern = get("attention.sliding_window_pattern", 6)
    sliding = (
        [bool(window)] * layers if fam.window_everywhere  # Phi-3, as transformers runs it
        else [bool(b) for b in pattern] if isinstance(pattern, list)
        else architectures.sliding_layers(layers, int(pattern)) if window
        else [False] * layers
    )  # fmt: skip
    query_dim = hidden / heads if arch == "gemma3" and layers == 62 else head_dim
    return architectures.make_config(
        fam,
        vocab=int(get("vocab_size", len(tokens) if tokens else None)),
        hidden=hidden,
        ffn=int(get("feed_forward_length")),
        layers=layers,
        heads=heads,
        kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(get("context_length", 2048)),
        tied="output.weight" not in tensors,
        full_rope=full_rope,
        local_rope=Rope(float(get("rope.freq_base_swa", 10000.0))),
        sliding=sliding,
        window=window,
        query_scale=1 / math.sqrt(query_dim),
        final_softcap=float(get("final_logit_softcapping", 0.0)),
    )


def _rope_factors(tensors: dict[str, GgufTensor], head_dim: int) -> tuple[float, ...] | None:
    t = tensors.get(ROPE_FREQS)
    if t is None:
        return None
    if t.shape != (head_dim // 2,):
        raise ValueError(
            f"tensor {ROPE_FREQS} has shape {t.shape}, but the model's config "
            f"implies ({head_dim // 2},)"
        )
    return tuple(float(f) for f in _vector(t))


# what numpy holds a tensor's data as (as the gguf package's reader shapes it): these types
# element by element, every other type as the bytes of its rows
_ELEMENTS: dict[int, type[np.generic]] = {
    Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64,
    Q.I8: np.int8, Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64,
}  # fmt: skip


def _tensor_data(t: GgufTensor) -> npt.NDArray[Any]:
    """A tensor's bytes read from the file into memory of its own, rows last-dimension-first:
    typed elements for the types in _ELEMENTS, else each row's blocks as uint8.

    Never a mapping of the file: the pages a loader read through one stayed resident until
    it was dropped, so the load peaked at the file's size on top of the weights (1 GB for the
    1.7B shape)."""
    raw = np.fromfile(str(t.path), np.uint8, count=t.n_bytes, offset=t.data_offset)
    if raw.size != t.n_bytes:
        raise ValueError(f"{t.path}: tensor {t.name} lies outside the file")
    shape = t.shape[::-1]
    if t.tensor_type in _ELEMENTS:
        return raw.view(_ELEMENTS[t.tensor_type]).reshape(shape)
    return raw.reshape(gguf.quant_shape_to_byte_shape(shape, Q(t.tensor_type)))


def _part(t: GgufTensor, rows: npt.NDArray[np.intp] | None = None) -> Part:
    """A matrix tensor as fp32 (F32, F16, BF16) or its integer form, rows reordered."""
    qtype = Q(t.tensor_type)
    data = _tensor_data(t)
    data = data.reshape(data.shape[0], -1) if data.ndim > 1 else data.reshape(1, -1)
    if rows is not None:
        data = data[rows]
    if qtype in gguf_types.DENSE:
        return np.ascontiguousarray(gguf.quants.dequantize(data, qtype), np.float32)
    if qtype not in gguf_types.DECODERS:
        raise ValueError(
            f"tensor {t.name}: GGUF type {qtype.name} is not served ({gguf_types.SERVED})"
        )
    return (qtype.name, gguf_types.decode(qtype, data))


def _vector(t: GgufTensor) -> F32:
    qtype = Q(t.tensor_type)
    if qtype not in gguf_types.DENSE and qtype not in gguf_types.DECODERS:
        raise ValueError(
            f"tensor {t.name}: GGUF type {qtype.name} is not served ({gguf_types.SERVED})"
        )
    values = gguf.quants.dequantize(_tensor_data(t), qtype)
    return np.ascontiguousarray(values, np.float32).reshape(-1)


def unpermute_rows(num_rows: int, n_head: int) -> npt.NDArray[np.intp]:
    """Row order that undoes llama.cpp's q/k permutation (back to HF rotate-half order)."""
    perm = (
        np.arange(num_rows).reshape(n_head, 2, num_rows // n_head // 2).swapaxes(1, 2).reshape(-1)
    )
    return np.argsort(perm)


def load(path: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    reader = gguf_reader(path)
    cfg = read_config(reader)
    fam = architectures.family(str(reader.value("general.architecture")), gguf=True)
    tensors = {t.name: t for t in reader.tensors}
    expected = architectures.tensor_shapes(cfg, fam)
    found = {name: t.shape[::-1] for name, t in tensors.items()}
    architectures.check_shapes(path, expected, found, lambda name: name == ROPE_FREQS)
    row_order = {}
    if fam.gguf_interleaved_qk:
        row_order = {
            "attn_q": unpermute_rows(cfg.q_dim, cfg.num_heads),
            "attn_k": unpermute_rows(cfg.kv_dim, cfg.num_kv_heads),
        }

    def matrix(name: str) -> Part:
        return _part(tensors[name], row_order.get(name.split(".")[-2]))

    weights = architectures.build_weights(
        cfg, fam, numerics, matrix, lambda name: _vector(tensors[name]), 0.0
    )
    # the shared parse (cached for the metadata readers) holds one Python object per
    # vocabulary entry: nothing needs it after the weights
    gguf_reader.cache_clear()
    return cfg, weights

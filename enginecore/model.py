"""The decoder forward pass over a paged KV cache, one kernel call per line.

One function serves every architecture (llama, qwen2, qwen3, gemma3, phi3): what differs between
them is data in ModelConfig (each layer's RoPE and attention window, the activation, the query
scale, embedding scaling, logit softcapping) and optional weights (q/k/v biases, per-head q/k
norms, norms of the sublayer outputs). A call runs a flattened varlen batch: any mix of
prefill chunks (a slice of a prompt at any start position, attending to what is already
cached) and single-token decodes. Only the rows that will be sampled reach the lm_head.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from enginecore import weights
from enginecore.kernels import attention, gemm, ops, panels, threads
from enginecore.kernels import layer as kernel_layer
from enginecore.weights import EXACT_STREAM_MAX_ROWS, F32, I32, Weights

# A sequence's run of at least this many rows in a BLAS-mode batch attends by BLAS GEMMs.
BLAS_ATTENTION_MIN_ROWS = 16


ACTIVATIONS = ("silu", "gelu_tanh")  # of the gate of the gated MLP: SwiGLU, GeGLU


@dataclass(frozen=True, slots=True)
class Rope:
    """Rotate-half RoPE of a layer: frequency i is theta ** (-2 i / head_dim) / factors[i]
    (Llama 3's scaling; None: all 1), at positions divided by `linear` (linear scaling)."""

    theta: float
    factors: tuple[float, ...] | None = None
    linear: float = 1.0


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int  # the context the model was trained for
    tie_embeddings: bool
    layer_rope: tuple[Rope, ...]  # one per layer
    layer_window: tuple[int, ...]  # one per layer: attend to the last `window` positions, 0: all
    query_scale: float  # q.k is multiplied by it (1 / sqrt(head_dim) but for Gemma's scalar)
    activation: str = "silu"
    embed_scale: float = 1.0  # the embedding rows are multiplied by it (Gemma: sqrt(hidden))
    final_softcap: float = 0.0  # logits = cap * tanh(logits / cap) when > 0

    def __post_init__(self) -> None:
        """Refuse shapes no real model has before anything is allocated for them (a file
        from an untrusted source must not make the server reserve gigabytes)."""
        limits = {
            "vocab_size": 1 << 20,
            "hidden_size": 1 << 16,
            "intermediate_size": 1 << 18,
            "num_layers": 1 << 9,
            "num_heads": 1 << 10,
            "num_kv_heads": 1 << 10,
            "head_dim": 1 << 10,
            "max_position": 1 << 21,
        }
        for name, limit in limits.items():
            value = getattr(self, name)
            if not 1 <= value <= limit:
                raise ValueError(f"model config {name} = {value} is outside 1..{limit}")
        if self.num_heads % self.num_kv_heads or self.head_dim % 2:
            raise ValueError(
                f"model config: {self.num_heads} heads over {self.num_kv_heads} kv heads of "
                f"dimension {self.head_dim}"
            )
        if not 0 < self.rms_eps < 1:
            raise ValueError(f"model config rms_eps {self.rms_eps}")
        if len(self.layer_rope) != self.num_layers or len(self.layer_window) != self.num_layers:
            raise ValueError(f"model config: rope and window of {self.num_layers} layers expected")
        for rope in self.layer_rope:
            n_freq = self.head_dim // 2
            if not (rope.theta > 0 and rope.linear > 0) or (
                rope.factors is not None
                and (len(rope.factors) != n_freq or not all(f > 0 for f in rope.factors))
            ):
                raise ValueError(f"model config: {rope} for heads of dimension {self.head_dim}")
        if any(w < 0 for w in self.layer_window) or self.activation not in ACTIVATIONS:
            raise ValueError(
                f"model config windows {self.layer_window}, activation {self.activation!r}"
            )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def rope_tables(cfg: ModelConfig, max_pos: int) -> list[tuple[F32, F32]]:
    """Per layer: cos, sin (max_pos, head_dim // 2) for rotate-half RoPE (layers with the same
    RoPE share their tables)."""
    half = cfg.head_dim // 2
    tables: dict[Rope, tuple[F32, F32]] = {}
    for rope in cfg.layer_rope:
        if rope not in tables:
            inv_freq = 1.0 / (rope.theta ** (np.arange(half, dtype=np.float64) * 2 / cfg.head_dim))
            if rope.factors is not None:
                inv_freq /= np.asarray(rope.factors, np.float64)
            angles = np.outer(np.arange(max_pos, dtype=np.float64) / rope.linear, inv_freq)
            tables[rope] = (np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    return [tables[rope] for rope in cfg.layer_rope]


KV_DTYPES = {"f32": np.float32, "f16": np.uint16}  # f16: fp16 bits (kernels/f16.py)


@dataclass(slots=True)
class KVCache:
    k: npt.NDArray[Any]  # (n_layers, n_blocks, n_kv_heads, head_dim, block_size) f32 / f16 bits
    v: npt.NDArray[Any]  # (n_layers, n_blocks, n_kv_heads, block_size, head_dim)

    @staticmethod
    def allocate(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: str) -> KVCache:
        shape = (cfg.num_layers, num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        k_shape = (cfg.num_layers, num_blocks, cfg.num_kv_heads, cfg.head_dim, block_size)
        k, v = np.empty(k_shape, KV_DTYPES[dtype]), np.empty(shape, KV_DTYPES[dtype])
        # written now, not on first use: np.zeros maps pages lazily, and the first store into
        # each fresh 2 MB page then faulted inside decode steps (6.6% of a busy core's samples)
        k.fill(0)
        v.fill(0)
        return KVCache(k, v)


@dataclass(frozen=True, slots=True)
class StackedLayers:
    """The per-layer arguments of kernels/layer.py's int_layers, stacked once at load: every
    layer a plain Llama layer whose matrices have the same types (so that one compiled loop
    runs them all)."""

    weights: Any  # per layer (wqkv, wo, w_gate_up, w_down) parts: kernels/layer.py's layer_list
    ffn_norms: F32  # (n_layers, d)
    next_norms: F32  # (n_layers, d): the next layer's attention norm (the last: unused)
    cos: F32  # (n_ropes, max_pos, head_dim // 2)
    sin: F32
    rope_of_layer: I32  # (n_layers,)
    windows: npt.NDArray[np.int64]  # (n_layers,)


def _cut_part(part: tuple[Any, int], cuts: list[int]) -> list[tuple[Any, int]]:
    """A panel part (fmt, n_rows) cut at the given row offsets inside it (multiples of
    LANES): views of its panels, the same numbers for every output element."""
    fmt, n_rows = part
    pieces, start = [], 0
    for end in [*cuts, n_rows]:
        a, b = start // panels.LANES, -(-end // panels.LANES)
        pieces.append((weights.panel_slice(fmt, a, b), end - start))
        start = end
    return pieces


def _common_parts(layers: list[tuple[Any, ...]]) -> list[tuple[Any, ...]] | None:
    """Every layer's matrices cut into parts at the union of all layers' part boundaries, so
    that layers which fuse different runs of types have the same structure (llama.cpp's
    Q4_K_M gives some layers' v projection its own type and fuses others' with q and k: one
    part in those layers, two in these); None when a boundary is not at a panel's edge."""
    out: list[list[Any]] = [[] for _ in layers]
    for m in range(len(layers[0])):
        bounds: set[int] = set()
        for layer in layers:
            at = 0
            for _, n_rows in layer[m][:-1]:
                at += n_rows
                bounds.add(at)
        if any(b % panels.LANES for b in bounds):
            return None
        for i, layer in enumerate(layers):
            parts, at = [], 0
            for part in layer[m]:
                inside = sorted(b - at for b in bounds if at < b < at + part[1])
                parts += _cut_part(part, inside)
                at += part[1]
            out[i].append(tuple(parts))
    return [tuple(mats) for mats in out]


def stack_layers(cfg: ModelConfig, w: Weights, rope: list[tuple[F32, F32]]) -> StackedLayers | None:
    """The layers stacked for one call per step, or None when they cannot run so."""
    panel_layers = w.panel_layers()
    if panel_layers is None or cfg.activation != "silu" or not all(lw.plain for lw in w.layers):
        return None
    if not kernel_layer.one_type(panel_layers):
        panel_layers = _common_parts(panel_layers)
    if panel_layers is None or not kernel_layer.one_type(panel_layers):
        return None  # the layers mix matrix types: a call per layer
    tables: list[tuple[F32, F32]] = []
    rope_of_layer = np.empty(len(rope), np.int32)
    for layer, (cos, sin) in enumerate(rope):
        known = [i for i, t in enumerate(tables) if t[0] is cos]
        rope_of_layer[layer] = known[0] if known else len(tables)
        if not known:
            tables.append((cos, sin))
    norms = [lw.attn_norm for lw in w.layers[1:]] + [w.layers[-1].ffn_norm]
    return StackedLayers(
        kernel_layer.layer_list(panel_layers),
        np.stack([lw.ffn_norm for lw in w.layers]),
        np.stack(norms),
        np.stack([c for c, _ in tables]),
        np.stack([s for _, s in tables]),
        rope_of_layer,
        np.asarray(cfg.layer_window, np.int64),
    )


def forward(
    cfg: ModelConfig,
    w: Weights,
    cache: KVCache,
    rope: list[tuple[F32, F32]],  # per layer (rope_tables)
    token_ids: I32,  # (n,)
    positions: I32,  # (n,)
    seq_of_token: I32,  # (n,) row of block_tables
    block_tables: I32,  # (n_seqs, max_blocks)
    slot_mapping: I32,  # (n,)
    sample_rows: I32,  # (r,) rows of the batch whose next token is wanted
    return_hidden: bool = False,
    stacked: StackedLayers | None = None,  # stack_layers(cfg, w, rope)
) -> F32:
    """Logits (r, vocab), or the final-normed hidden states (r, d) when return_hidden."""
    n = token_ids.shape[0]
    # Exact mode, few rows: every matmul streams the quantized panels in a numba kernel. Many
    # rows: sgemm on dequantized tiles (or dense weights), called from numba's threads
    # (kernels/gemm.py). Without that, BLAS runs its own threads and every numba kernel must
    # stay on one thread, since a numba parallel region next to a BLAS call fights BLAS's
    # spinning workers. Integer modes run the same kernels for every row count, so that a
    # row's result never depends on the batch around it.
    blas = n > EXACT_STREAM_MAX_ROWS and not w.numerics.batch_invariant
    with threads.limited(1) if blas and not gemm.AVAILABLE else nullcontext():
        return _forward(
            cfg, w, cache, rope, token_ids, positions, seq_of_token, block_tables,
            slot_mapping, sample_rows, return_hidden, blas, stacked,
        )  # fmt: skip


def _forward(
    cfg: ModelConfig,
    w: Weights,
    cache: KVCache,
    rope: list[tuple[F32, F32]],
    token_ids: I32,
    positions: I32,
    seq_of_token: I32,
    block_tables: I32,
    slot_mapping: I32,
    sample_rows: I32,
    return_hidden: bool,
    blas: bool,
    stacked: StackedLayers | None,
) -> F32:
    n, d, eps = token_ids.shape[0], cfg.hidden_size, cfg.rms_eps
    x = np.empty((n, d), np.float32)  # residual stream
    h = np.empty((n, d), np.float32)  # normed input of a sublayer
    qkv = np.empty((n, cfg.q_dim + 2 * cfg.kv_dim), np.float32)
    att = np.empty((n, cfg.q_dim), np.float32)
    proj = np.empty((n, d), np.float32)
    gate_up = np.empty((n, 2 * cfg.intermediate_size), np.float32)
    act = np.empty((n, cfg.intermediate_size), np.float32)
    # many rows, and numba owns both cores (kernels/gemm.py): row ops split the rows too, and
    # long prefill chunks attend by sgemm
    split_rows = blas and gemm.AVAILABLE
    plan = attention.plan(seq_of_token, BLAS_ATTENTION_MIN_ROWS if split_rows else None, positions)
    rotate = ops.rope_parallel if split_rows else ops.rope
    add_rmsnorm = ops.add_rmsnorm_parallel if split_rows else ops.add_rmsnorm
    if cfg.activation == "silu":
        activate = ops.silu_mul_parallel if split_rows else ops.silu_mul
    else:
        activate = ops.gelu_mul_parallel if split_rows else ops.gelu_mul

    w.embed.gather(token_ids, x)
    if cfg.embed_scale != 1.0:
        x *= np.float32(cfg.embed_scale)
    ops.rmsnorm(x, w.layers[0].attn_norm, eps, h)
    # integer numerics: each layer below is one numba call running the same kernels, or all
    # of them one call when they are stacked
    panel_layers = w.panel_layers()
    kind, qmax = weights.ACTIVATIONS.get(w.numerics, (None, 0))
    if stacked is not None and panel_layers is not None:
        kernel_layer.int_layers(
            x, h, qkv, att, proj, gate_up, act, positions, stacked.cos, stacked.sin,
            stacked.rope_of_layer, slot_mapping, plan.kernel_tokens, seq_of_token, block_tables,
            cache.k, cache.v, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps,
            stacked.ffn_norms, stacked.next_norms, stacked.weights, kind, qmax, weights.isa_arg(),
            threads.count(), stacked.windows, cfg.query_scale,
        )  # fmt: skip
    for layer, lw in enumerate(w.layers if stacked is None or panel_layers is None else ()):
        last = layer + 1 == len(w.layers)
        cos, sin = rope[layer]
        if panel_layers is not None and cfg.activation == "silu" and lw.plain:
            next_norm = lw.ffn_norm if last else w.layers[layer + 1].attn_norm
            wqkv, wo, w_gate_up, w_down = panel_layers[layer]
            kernel_layer.int_layer(
                x, h, qkv, att, proj, gate_up, act, positions, cos, sin, slot_mapping,
                plan.kernel_tokens, seq_of_token, block_tables, cache.k[layer], cache.v[layer],
                cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps, lw.ffn_norm, next_norm, last,
                wqkv, wo, w_gate_up, w_down, kind, qmax, weights.isa_arg(), threads.count(),
                cfg.layer_window[layer], cfg.query_scale,
            )  # fmt: skip
            continue
        lw.wqkv.matmul(h, qkv)  # [q | k | v]
        if lw.qkv_bias is not None:
            qkv += lw.qkv_bias
        if lw.q_norm is not None and lw.k_norm is not None:  # each head, before RoPE
            ops.head_rmsnorm(qkv, 0, cfg.num_heads, cfg.head_dim, lw.q_norm, eps)
            ops.head_rmsnorm(qkv, cfg.q_dim, cfg.num_kv_heads, cfg.head_dim, lw.k_norm, eps)
        rotate(qkv, positions, cos, sin, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
        attention.store_kv(qkv, slot_mapping, cfg.q_dim, cfg.kv_dim, cache.k[layer],
                           cache.v[layer], threads.count())  # fmt: skip
        attention.attend(
            qkv, plan, seq_of_token, positions, block_tables, cache.k[layer], cache.v[layer],
            cfg.num_heads, att, cfg.layer_window[layer], cfg.query_scale,
        )  # fmt: skip
        lw.wo.matmul(att, proj)
        if lw.post_attn_norm is not None:
            ops.rmsnorm(proj, lw.post_attn_norm, eps, proj)
        add_rmsnorm(x, proj, lw.ffn_norm, eps, h)  # x += proj; h = norm(x)
        lw.w_gate_up.matmul(h, gate_up)
        activate(gate_up, act)
        lw.w_down.matmul(act, proj)
        if lw.post_ffn_norm is not None:
            ops.rmsnorm(proj, lw.post_ffn_norm, eps, proj)
        if not last:
            add_rmsnorm(x, proj, w.layers[layer + 1].attn_norm, eps, h)
        else:
            ops.add_inplace(x, proj)

    rows = np.ascontiguousarray(x[sample_rows])
    out = np.empty_like(rows)
    ops.rmsnorm(rows, w.final_norm, eps, out)
    if return_hidden:
        return out
    logits = np.empty((rows.shape[0], cfg.vocab_size), np.float32)
    w.lm_head.matmul(out, logits)
    if cfg.final_softcap > 0:
        cap = np.float32(cfg.final_softcap)
        logits = np.tanh(logits / cap) * cap
    return logits

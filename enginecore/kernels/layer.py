"""One decoder layer of an integer-numerics model in one numba call.

The unfused forward pass makes ten or so Python -> numba calls per layer (quantize, matmul,
rope, store, attend, norm, ...), each paying numba's argument unboxing; a decode step of a
30-layer model made ~300 of them. Here a layer is one call that runs the same kernels in the
same order on the same buffers, so every output element is computed exactly as in the
unfused pass (and stays batch-invariant): only the dispatch between the kernels is gone.

A matrix is a tuple of parts, each (fmt, n_rows) (kernels/panels.py's format); a fused
matrix of several GGUF types has one part per type, stacked along the output columns.

When every layer's matrices have the same types, int_layers runs all the layers in one call:
a decode step's 30 calls cost ~0.6 ms of Python and argument unboxing at batch 1.
"""

from typing import Any

import numba
from numba import njit
from numba.typed import List

from enginecore.kernels import ops
from enginecore.kernels.attention import paged_attention, store_kv
from enginecore.kernels.panels import int_matmul, quantize_matmul

# Steps of at least this many rows split RoPE, the activation and the norms over the workers
# too (a parallel region costs ~2 us; a row of the bundled model's silu_mul ~1.1 us, of RoPE
# ~0.7): on one thread they were 7% of a 512-token prefill. Either way each row is the same
# inlined code, so the split changes no bit.
PARALLEL_ROW_OPS = 16


@njit(cache=True, nogil=True, inline="always")
def _matmul(x, kind, qmax, parts, isa, out, workers):
    # out = x @ W.T for W the stacked parts; x quantized once for every part, in the first
    # part's parallel region
    xq, xa, xb = quantize_matmul(x, kind, qmax, parts[0][0], isa, out, 0, parts[0][1], workers)
    col0 = 0
    for fmt, n_rows in parts:  # (an empty tuple, parts[1:] of one part, does not type)
        if col0 > 0:
            int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, workers)
        col0 += n_rows


@njit(cache=True, nogil=True)
def int_layer(
    x, h, qkv, att, proj, gate_up, act, positions, cos, sin, slot_mapping, tokens,
    seq_of_token, block_tables, k_cache, v_cache, n_heads, n_kv_heads, head_dim, eps,
    ffn_norm, next_norm, last, wqkv, wo, w_gate_up, w_down, kind, qmax, isa, workers,
    window, scale,
):  # fmt: skip
    # x (n, d) the residual stream, h (n, d) its normed input; the rest are the unfused
    # pass's buffers and arguments (enginecore/model.py). On return h = next_norm(x), or x
    # holds the layer's output and h is stale when `last`.
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    split = x.shape[0] >= PARALLEL_ROW_OPS
    _matmul(h, kind, qmax, wqkv, isa, qkv, workers)
    if split:
        ops.rope_parallel(qkv, positions, cos, sin, n_heads + n_kv_heads, head_dim)
    else:
        ops.rope(qkv, positions, cos, sin, n_heads + n_kv_heads, head_dim)
    store_kv(qkv, slot_mapping, q_dim, kv_dim, k_cache, v_cache, workers)
    # the same compiled attention kernel as the unfused pass, so that a token's result is the
    # same bits in any batch
    paged_attention(qkv, tokens, seq_of_token, positions, block_tables, k_cache, v_cache,
                    n_heads, att, workers, window, scale)  # fmt: skip
    _matmul(att, kind, qmax, wo, isa, proj, workers)
    _add_rmsnorm(x, proj, ffn_norm, eps, h, split)
    _matmul(h, kind, qmax, w_gate_up, isa, gate_up, workers)
    if split:
        ops.silu_mul_parallel(gate_up, act)
    else:
        ops.silu_mul(gate_up, act)
    _matmul(act, kind, qmax, w_down, isa, proj, workers)
    if last:
        ops.add_inplace(x, proj)
    else:
        _add_rmsnorm(x, proj, next_norm, eps, h, split)


@njit(cache=True, nogil=True, inline="always")
def _add_rmsnorm(x, y, w, eps, out, split):
    if split:
        ops.add_rmsnorm_parallel(x, y, w, eps, out)
    else:
        ops.add_rmsnorm(x, y, w, eps, out)


def one_type(layers: list[tuple[Any, ...]]) -> bool:
    """True when every layer's arguments have the same numba type (int_layers can take them)."""
    return len({numba.typeof(layer) for layer in layers}) == 1  # type: ignore[no-untyped-call]


def layer_list(layers: list[tuple[Any, ...]]) -> Any:
    """The layers' weights (one_type) as the numba typed List int_layers takes. A tuple of them
    was unboxed array by array at every call (a 30-layer Q4_K_M model's ~900 arrays: ~0.6 ms
    of a one-row step, bench.ab) and made int_layers' compiled wrapper 22.9 MB of LLVM IR:
    214 s of a 650 s cold start (bench/README.md). The List is built by cached functions:
    `List(layers)` compiles the List's methods in every process (numba caches none of a typed
    container's own), ~1 s of each start."""
    out = _list_of(layers[0])
    for layer in layers[1:]:
        _append(out, layer)
    return out


@njit(cache=True)
def _list_of(layer):
    out = List()
    out.append(layer)
    return out


@njit(cache=True)
def _append(out, layer):
    out.append(layer)


@njit(cache=True, nogil=True)
def int_layers(
    x, h, qkv, att, proj, gate_up, act, positions, cos, sin, rope_of_layer, slot_mapping,
    tokens, seq_of_token, block_tables, k_cache, v_cache, n_heads, n_kv_heads, head_dim, eps,
    ffn_norms, next_norms, layers, kind, qmax, isa, workers, windows, scale,
):  # fmt: skip
    # every layer in one call: layer l is int_layer with its rows of the stacked per-layer
    # arrays (cos, sin (n_ropes, max_pos, head_dim // 2) picked by rope_of_layer; the caches
    # (n_layers, ...); ffn_norms, next_norms (n_layers, d); windows (n_layers,)) and its
    # weights layers[l] = (wqkv, wo, w_gate_up, w_down) (a typed List: layer_list), so the
    # same compiled layer runs
    n_layers = len(layers)
    for layer in range(n_layers):
        wqkv, wo, w_gate_up, w_down = layers[layer]
        r = rope_of_layer[layer]
        int_layer(
            x, h, qkv, att, proj, gate_up, act, positions, cos[r], sin[r], slot_mapping, tokens,
            seq_of_token, block_tables, k_cache[layer], v_cache[layer], n_heads, n_kv_heads,
            head_dim, eps, ffn_norms[layer], next_norms[layer], layer + 1 == n_layers, wqkv, wo,
            w_gate_up, w_down, kind, qmax, isa, workers, windows[layer], scale,
        )  # fmt: skip

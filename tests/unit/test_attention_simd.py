"""The vector attention tiles: the same bits as their scalar fma chains, and attention itself on
the shapes that take them (block sizes of 16 and more, head dims that are multiples of 16)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from enginecore.kernels import attention
from enginecore.kernels.attention_simd import (
    PV_HEADS,
    PV_VECS,
    QK_BLOCKS,
    QK_HEADS,
    pv_scalar,
    pv_tile,
    qk_blocks,
    qk_scalar,
    qk_tile,
    tile_vecs,
)

RNG = np.random.default_rng(7)


@njit(cache=True)
def _qk_both(q, k, k_stride, n, heads, nv, s_tile, s_scalar):
    qk_tile(q, 3, n + 5, k, 2, k_stride, n, s_tile, 1, 40, heads, nv, 1)  # prefetching k
    qk_scalar(q, 3, n + 5, k, 2, k_stride, n, s_scalar, 1, 40, heads, 16 * nv)


@njit(cache=True)
def _qk_blocks_both(q, k, offs, n, heads, nv, s_tile, s_scalar):
    qk_blocks(q, 3, n + 5, k, offs, 16, n, s_tile, 1, 70, heads, nv, nv)  # prefetching
    for c in range(nv):  # each block's 16 positions, their own rows of 16 in k
        qk_scalar(q, 3, n + 5, k, offs[c], 16, n, s_scalar, 1 + 16 * c, 70, heads, 16)


@njit(cache=True)
def _pv_both(w, v, v_stride, n, heads, nv, a_tile, a_scalar):
    pv_tile(w, 1, n + 3, v, 4, v_stride, n, a_tile, 2, 16 * nv + 7, heads, nv, -1)
    pv_scalar(w, 1, n + 3, v, 4, v_stride, n, a_scalar, 2, 16 * nv + 7, heads, 16 * nv)


def _kv(shape: tuple[int, ...], f16: bool) -> np.ndarray:
    x = RNG.standard_normal(shape).astype(np.float32)
    return x.astype(np.float16).view(np.uint16) if f16 else x


@pytest.mark.parametrize("f16", [False, True])
def test_qk_tile_is_its_scalar_fma_chain_bit_for_bit(f16: bool) -> None:
    for heads in range(1, QK_HEADS + 1):
        for nv in (1, 2):
            n, k_stride = 61, 16 * nv + 9
            q = RNG.standard_normal(3 + heads * (n + 5)).astype(np.float32)
            k = _kv((2 + n * k_stride,), f16)
            got, want = (np.full(1 + heads * 40, np.nan, np.float32) for _ in range(2))
            _qk_both(q, k, k_stride, n, heads, nv, got, want)
            np.testing.assert_array_equal(got, want)
            assert not np.isnan(got[1 : 1 + 16 * nv]).any()
            # and it is q . k: head 0, position 5, against float64
            kf = k.view(np.float16).astype(np.float64) if f16 else k.astype(np.float64)
            ref = q[3 : 3 + n].astype(np.float64) @ kf[2 + 5 : 2 + 5 + n * k_stride : k_stride]
            assert abs(got[1 + 5] - ref) < 1e-4


@pytest.mark.parametrize("f16", [False, True])
def test_qk_blocks_takes_scattered_blocks_as_the_scalar_fma_chain_bit_for_bit(f16: bool) -> None:
    n = 48  # head_dim: the rows of a block, 16 positions each
    for heads in range(1, QK_HEADS + 1):
        for nv in range(1, tile_vecs(heads, QK_BLOCKS) + 1):
            blocks = RNG.permutation(9)[:nv]  # scattered, in any order
            k = _kv((9 * n * 16,), f16)
            offs = np.concatenate([blocks, blocks[::-1]]) * n * 16  # then the ones to prefetch
            q = RNG.standard_normal(3 + heads * (n + 5)).astype(np.float32)
            got, want = (np.full(1 + heads * 70, np.nan, np.float32) for _ in range(2))
            _qk_blocks_both(q, k, offs, n, heads, nv, got, want)
            np.testing.assert_array_equal(got, want)
            assert not np.isnan(got[1 : 1 + 16 * nv]).any()
            # and it is q . k: head 0, block c's position 3, against float64
            kf = k.view(np.float16).astype(np.float64) if f16 else k.astype(np.float64)
            for c in range(nv):
                ref = q[3 : 3 + n].astype(np.float64) @ kf[offs[c] + 3 : offs[c] + n * 16 : 16]
                assert abs(got[1 + 16 * c + 3] - ref) < 1e-4


@pytest.mark.parametrize("f16", [False, True])
def test_pv_tile_is_its_scalar_fma_chain_bit_for_bit(f16: bool) -> None:
    for heads in range(1, PV_HEADS + 1):
        for nv in range(1, PV_VECS + 1):
            n, v_stride = 37, 16 * nv + 11
            w = RNG.random(1 + heads * (n + 3)).astype(np.float32)
            v = _kv((4 + n * v_stride,), f16)
            start = RNG.standard_normal(2 + heads * (16 * nv + 7)).astype(np.float32)
            got, want = start.copy(), start.copy()
            _pv_both(w, v, v_stride, n, heads, nv, got, want)
            np.testing.assert_array_equal(got, want)
            vf = v.view(np.float16).astype(np.float64) if f16 else v.astype(np.float64)
            rows = vf[4 : 4 + n * v_stride].reshape(n, v_stride)
            ref = start[2 : 2 + 16 * nv] + w[1 : 1 + n].astype(np.float64) @ rows[:, : 16 * nv]
            np.testing.assert_allclose(got[2 : 2 + 16 * nv], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("bs", "hd", "n_kv", "n_heads", "window"),
    [
        (16, 48, 2, 10, 0),
        (32, 64, 3, 9, 0),
        (64, 80, 1, 7, 0),
        (32, 64, 3, 9, 45),
        (16, 64, 3, 9, 45),
        (8, 64, 2, 4, 0),
    ],
)
def test_paged_attention_equals_dense_attention(
    bs: int, hd: int, n_kv: int, n_heads: int, window: int
) -> None:
    """Decodes at contexts of 1 to 200 in scattered blocks (and a 24-row prefill chunk), each
    row against float64 attention over the keys it sees."""
    n_blocks = 80 * 64 // bs
    k = RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(np.float32)
    v = RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(np.float32)
    ctxs = [1, 15, 16, 17, 33, 64, 100, 200]
    per_seq = -(-max(ctxs) // bs)
    tables = RNG.permutation(n_blocks)[: per_seq * (len(ctxs) + 1)].reshape(-1, per_seq)
    tables = tables.astype(np.int32)
    positions = np.array([c - 1 for c in ctxs] + list(range(150, 174)), np.int32)
    seq_of_token = np.array(list(range(len(ctxs))) + [len(ctxs)] * 24, np.int32)
    n = positions.shape[0]
    qkv = RNG.standard_normal((n, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    scale = 0.11
    out = np.full((n, n_heads * hd), np.nan, np.float32)
    attention.attend(qkv, attention.plan(seq_of_token, None), seq_of_token, positions, tables,
                     attention.k_cache_layout(k), attention.v_cache_layout(v), n_heads, out, window,
                     scale)  # fmt: skip
    assert_dense(out, qkv, k, v, tables[seq_of_token], positions, window, scale)
    # a prefill row's q.k tiles take several blocks at once (its keys are the chunk's), a row
    # alone one block a tile: the same fma chains, the same bits
    for t in (len(ctxs), n - 1):
        alone = np.full((1, n_heads * hd), np.nan, np.float32)
        one = np.array([0], np.int32)
        attention.attend(qkv[t : t + 1], attention.plan(one, None), one, positions[t : t + 1],
                         tables[seq_of_token[t : t + 1]], attention.k_cache_layout(k),
                         attention.v_cache_layout(v), n_heads, alone, window, scale)  # fmt: skip
        np.testing.assert_array_equal(alone[0], out[t])


def assert_dense(
    out: np.ndarray, qkv: np.ndarray, k: np.ndarray, v: np.ndarray, tables: np.ndarray,
    positions: np.ndarray, window: int, scale: float,
) -> None:  # fmt: skip
    """Each row t of out against float64 attention over the keys it sees: K and V (n_blocks,
    bs, n_kv, head_dim) in blocks tables[t], positions[t] its last, its last `window` if any."""
    n_kv, hd = k.shape[2], k.shape[3]
    n_heads = out.shape[1] // hd
    group = n_heads // n_kv
    for t, p in enumerate(positions):
        keys = k[tables[t]].reshape(-1, n_kv, hd).astype(np.float64)
        values = v[tables[t]].reshape(-1, n_kv, hd).astype(np.float64)
        lo = max(p + 1 - window, 0) if window else 0
        for h in range(n_heads):
            s = keys[lo : p + 1, h // group] @ qkv[t, h * hd : (h + 1) * hd] * scale
            e = np.exp(s - s.max())
            ref = (e / e.sum()) @ values[lo : p + 1, h // group]
            np.testing.assert_allclose(out[t, h * hd : (h + 1) * hd], ref, rtol=1e-4, atol=1e-5)


@njit(cache=True)
def _row_max(s, r, lo, lim):
    return attention._row_max(s[r, lo:lim])


def test_a_softmax_rows_max_is_the_max_of_its_span() -> None:
    # eight partial maxima and a scalar tail: every span length, start and place of the max
    s = RNG.standard_normal((3, 70)).astype(np.float32)
    for lo in (0, 1, 7, 9):
        for lim in range(lo + 1, 70):
            for r in range(3):
                assert _row_max(s, r, lo, lim) == s[r, lo:lim].max()
    s[1, 33] = 1e6  # one large element, in a partial and in the tail
    assert _row_max(s, 1, 0, 64) == np.float32(1e6)
    assert _row_max(s, 1, 30, 34) == np.float32(1e6)


@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("window", [0, 300])
def test_long_contexts_attend_run_by_run_like_dense_attention(f16: bool, window: int) -> None:
    """Decodes whose visible keys reach into several runs of SPAN_CHUNK positions (each run an
    item, the runs' partial softmaxes joined after the region), around and across the runs'
    edges, alone and in a batch, against float64 attention."""
    run = attention.SPAN_CHUNK
    bs, hd, n_kv, n_heads = 16, 64, 3, 9
    ctxs = [run - 1, run, run + 1, 2 * run - 1, 2 * run + 5, 3 * run + 77, 4 * run + 1]
    per_seq = -(-max(ctxs) // bs)
    n_blocks = per_seq * len(ctxs)
    k = RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(np.float32)
    v = RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(np.float32)
    if f16:
        k, v = (a.astype(np.float16).view(np.uint16) for a in (k, v))
    kc, vc = attention.k_cache_layout(k), attention.v_cache_layout(v)
    tables = RNG.permutation(n_blocks).astype(np.int32).reshape(len(ctxs), per_seq)
    positions = np.array([c - 1 for c in ctxs], np.int32)
    seq = np.arange(len(ctxs), dtype=np.int32)
    qkv = RNG.standard_normal((len(ctxs), (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    scale = 0.125
    out = np.full((len(ctxs), n_heads * hd), np.nan, np.float32)
    attention.attend(qkv, attention.plan(seq, None), seq, positions, tables, kc, vc, n_heads, out,
                     window, scale)  # fmt: skip
    kf, vf = (a.view(np.float16).astype(np.float32) if f16 else a for a in (k, v))
    assert_dense(out, qkv, kf, vf, tables, positions, window, scale)

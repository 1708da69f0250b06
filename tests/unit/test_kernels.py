"""Each numba kernel against plain numpy (float64) on random data, odd sizes and tails included."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from numba import njit

from enginecore.kernels import attention, ops, threads

RNG = np.random.default_rng(1234)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@njit(fastmath=ops.FAST, error_model="numpy")
def _exp_all(x, out):
    for i in range(x.shape[0]):
        out[i] = ops.fast_exp(x[i])


def test_fast_exp_is_within_a_few_ulp_of_exp() -> None:
    x = np.linspace(-87, 87, 200_001).astype(np.float32)
    got = np.empty_like(x)
    _exp_all(x, got)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 3e-7


@njit(fastmath=ops.FAST, error_model="numpy")
def _lane_sum(x, square):
    return ops.lane_sum(x, square)


def _in_lane_order(x: np.ndarray) -> np.float32:
    """lane_sum's order in numpy float32: eight partial sums over x[j::8] of the whole groups of
    eight, added pairwise, then the tail in turn."""
    f = np.float32
    end = len(x) // 8 * 8
    s = [f(0.0)] * 8
    for p in range(0, end, 8):
        s = [f(s[j] + x[p + j]) for j in range(8)]
    total = f(f(f(s[0] + s[1]) + f(s[2] + s[3])) + f(f(s[4] + s[5]) + f(s[6] + s[7])))
    for v in x[end:]:
        total = f(total + v)
    return total


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 31, 64, 200, 576])
def test_lane_sum_adds_in_its_stated_order(n: int) -> None:
    # the same bits as the order written out (its vector lanes are the eight partial sums)
    x = randn(n) * 10
    assert np.float32(_lane_sum(x, False)).tobytes() == _in_lane_order(x).tobytes()
    want = (x.astype(np.float64) ** 2).sum()
    np.testing.assert_allclose(_lane_sum(x, True), want, rtol=1e-5)


def test_rmsnorm_and_fused_add_rmsnorm() -> None:
    x, y, w = randn(5, 37), randn(5, 37), randn(37)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-5, out)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    s = (x64 + y).copy()
    ops.add_rmsnorm(x, y, w, 1e-5, out)
    np.testing.assert_allclose(x, s, rtol=1e-6)
    np.testing.assert_allclose(
        out, s / np.sqrt((s**2).mean(1, keepdims=True) + 1e-5) * w, 1e-5, 1e-5
    )


def test_rope_rotates_each_half_pair() -> None:
    n_heads, hd = 3, 8
    x = randn(4, n_heads * hd + 5)  # trailing columns (v) stay untouched
    pos = np.array([0, 3, 7, 2], np.int32)
    ang = np.outer(np.arange(10), 1.0 / 10000 ** (np.arange(hd // 2) * 2 / hd))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    want = x.astype(np.float64).copy()
    for t in range(4):
        for h in range(n_heads):
            a, b = (
                want[t, h * hd : h * hd + hd // 2].copy(),
                want[t, h * hd + hd // 2 : (h + 1) * hd].copy(),
            )
            c, s = cos[pos[t]], sin[pos[t]]
            want[t, h * hd : h * hd + hd // 2] = a * c - b * s
            want[t, h * hd + hd // 2 : (h + 1) * hd] = b * c + a * s
    ops.rope(x, pos, cos, sin, n_heads, hd)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)


def test_silu_mul_and_add() -> None:
    gu = randn(3, 2 * 41) * 4
    out = np.empty((3, 41), np.float32)
    ops.silu_mul(gu, out)
    g = gu[:, :41].astype(np.float64)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * gu[:, 41:], rtol=1e-5, atol=1e-6)
    x, y = randn(3, 7), randn(3, 7)
    want = x + y
    ops.add_inplace(x, y)
    np.testing.assert_array_equal(x, want)


def test_row_split_kernels_equal_their_serial_twins() -> None:
    # the same row code, compiled twice: every sum's order is the source's (ops.FAST), so the
    # same bits
    n, d, f, n_heads, hd = 37, 24, 20, 4, 6
    pos = RNG.integers(0, 50, n).astype(np.int32)
    cos, sin = randn(50, hd // 2), randn(50, hd // 2)
    x = randn(n, n_heads * hd + 3)
    a, b = x.copy(), x.copy()
    ops.rope(a, pos, cos, sin, n_heads, hd)
    ops.rope_parallel(b, pos, cos, sin, n_heads, hd)
    np.testing.assert_array_equal(a, b)
    resid, y, w = randn(n, d), randn(n, d), randn(d)
    r1, r2, o1, o2 = (
        resid.copy(),
        resid.copy(),
        np.empty((n, d), np.float32),
        np.empty((n, d), np.float32),
    )
    ops.add_rmsnorm(r1, y, w, 1e-5, o1)
    ops.add_rmsnorm_parallel(r2, y, w, 1e-5, o2)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(o1, o2)
    gu, s1, s2 = randn(n, 2 * f), np.empty((n, f), np.float32), np.empty((n, f), np.float32)
    ops.silu_mul(gu, s1)
    ops.silu_mul_parallel(gu, s2)
    np.testing.assert_array_equal(s1, s2)


BS, N_KV, HD, N_HEADS = 4, 2, 8, 6  # GQA group of 3


K = attention.k_cache_layout  # keys made position by position, as the K cache holds them
V = attention.v_cache_layout  # and values


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: int) -> np.ndarray:
    """One token's heads; k, v (ctx, n_kv, hd) in float64."""
    out = np.empty((N_HEADS, HD))
    for h in range(N_HEADS):
        kvh = h // (N_HEADS // N_KV)
        s = k[: pos + 1, kvh] @ q[h] / math.sqrt(HD)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[: pos + 1, kvh]
    return out.reshape(-1)


def test_blas_attention_over_several_query_tiles_equals_the_kernel() -> None:
    """A chunk of 2 tiles and a part (rows at positions 37..) after 37 cached tokens."""
    n = 2 * attention.QUERY_TILE + 13
    ctx = 37 + n
    table = RNG.permutation(-(-ctx // BS) + 3)[: -(-ctx // BS)].astype(np.int32)[None]
    k_cache, v_cache = randn(table.size + 3, BS, N_KV, HD), randn(table.size + 3, BS, N_KV, HD)
    positions = np.arange(37, ctx, dtype=np.int32)
    seq_of_token = np.zeros(n, np.int32)
    qkv = randn(n, N_HEADS * HD + 2 * N_KV * HD)
    outs = []
    for min_run in (None, 16):
        plan = attention.plan(seq_of_token, min_run)
        out = np.full((n, N_HEADS * HD), np.nan, np.float32)
        attention.attend(
            qkv, plan, seq_of_token, positions, table, K(k_cache), V(v_cache), N_HEADS, out
        )
        outs.append(out)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5)


def test_paged_and_blas_attention_equal_dense_attention() -> None:
    """Two sequences in scattered blocks: a 21-token prefill chunk after 6 cached and a decode."""
    n_blocks = 20
    k_cache, v_cache = randn(n_blocks, BS, N_KV, HD), randn(n_blocks, BS, N_KV, HD)
    tables = np.array([[17, 3, 9, 0, 12, 5, 8], [2, 14, 6, 1, 0, 0, 0]], np.int32)
    positions = np.concatenate([np.arange(6, 27), [13]]).astype(np.int32)
    seq_of_token = np.array([0] * 21 + [1], np.int32)
    qkv = randn(22, N_HEADS * HD + 2 * N_KV * HD)

    def context(s: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        blocks = tables[s, : -(-ctx // BS)]
        return (
            k_cache[blocks].reshape(-1, N_KV, HD).astype(np.float64),
            v_cache[blocks].reshape(-1, N_KV, HD).astype(np.float64),
        )

    want = np.stack(
        [
            dense_attention(
                qkv[t, : N_HEADS * HD].reshape(N_HEADS, HD),
                *context(seq_of_token[t], 28),
                positions[t],
            )
            for t in range(22)
        ]
    )
    for min_run in (None, 5):  # all rows by the numba kernel, then the prefill run by BLAS
        plan = attention.plan(seq_of_token, min_run)
        assert (len(plan.runs), plan.kernel_tokens.shape[0]) == (
            (0, 22) if min_run is None else (1, 1)
        )
        out = np.full((22, N_HEADS * HD), np.nan, np.float32)
        attention.attend(
            qkv, plan, seq_of_token, positions, tables, K(k_cache), V(v_cache), N_HEADS, out
        )
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_fp16_kv_cache_attends_like_the_fp32_cache_holding_the_same_values() -> None:
    n_blocks = 12
    k32 = randn(n_blocks, BS, N_KV, HD).astype(np.float16)
    v32 = randn(n_blocks, BS, N_KV, HD).astype(np.float16)
    tables = np.array([[7, 3, 9, 0, 11], [2, 5, 6, 1, 4]], np.int32)
    positions = np.concatenate([np.arange(0, 18), [13]]).astype(np.int32)
    seq_of_token = np.array([0] * 18 + [1], np.int32)
    qkv = randn(19, N_HEADS * HD + 2 * N_KV * HD)
    for min_run in (None, 5):
        plan = attention.plan(seq_of_token, min_run)
        outs = []
        for k, v in ((k32.astype(np.float32), v32.astype(np.float32)),
                     (k32.view(np.uint16), v32.view(np.uint16))):  # fmt: skip
            out = np.full((19, N_HEADS * HD), np.nan, np.float32)
            attention.attend(qkv, plan, seq_of_token, positions, tables, K(k), V(v), N_HEADS, out)
            outs.append(out)
        np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("n", [3, attention.STORE_SERIAL_BELOW + 25])  # one thread, all
def test_store_kv_rounds_to_fp16_like_numpy(n: int) -> None:
    q_dim, kv_dim = N_HEADS * HD, N_KV * HD
    qkv = randn(n, q_dim + 2 * kv_dim) * 100
    blocks = -(-3 * n // BS)
    k_cache, v_cache = (
        np.zeros((blocks, N_KV, HD, BS), np.uint16),
        np.zeros((blocks, N_KV, BS, HD), np.uint16),
    )
    slots = np.random.default_rng(n).permutation(blocks * BS)[:n].astype(np.int32)
    attention.store_kv(qkv, slots, q_dim, kv_dim, k_cache, v_cache, 2)
    flat_k = attention.k_positions(k_cache).reshape(-1, kv_dim)[slots]
    flat_v = attention.v_positions(v_cache).reshape(-1, kv_dim)[slots]
    np.testing.assert_array_equal(
        flat_k, qkv[:, q_dim : q_dim + kv_dim].astype(np.float16).view(np.uint16)
    )
    np.testing.assert_array_equal(
        flat_v, qkv[:, q_dim + kv_dim :].astype(np.float16).view(np.uint16)
    )


def test_store_kv_writes_each_slot() -> None:
    q_dim, kv_dim = N_HEADS * HD, N_KV * HD
    qkv = randn(3, q_dim + 2 * kv_dim)
    k_cache, v_cache = (
        np.zeros((4, N_KV, HD, BS), np.float32),
        np.zeros((4, N_KV, BS, HD), np.float32),
    )
    slots = np.array([13, 2, 7], np.int32)
    attention.store_kv(qkv, slots, q_dim, kv_dim, k_cache, v_cache, 2)
    flat_k = attention.k_positions(k_cache).reshape(-1, kv_dim)
    flat_v = attention.v_positions(v_cache).reshape(-1, kv_dim)
    np.testing.assert_array_equal(flat_k[slots], qkv[:, q_dim : q_dim + kv_dim])
    np.testing.assert_array_equal(flat_v[slots], qkv[:, q_dim + kv_dim :])
    assert np.count_nonzero(flat_k.any(1)) == 3


def test_limited_threads_are_restored() -> None:
    before = numba.get_num_threads()
    with threads.limited(1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


def test_sliding_window_attention_sees_only_its_window_on_both_paths() -> None:
    """A 30-token chunk after 9 cached, window 7 and a query scale of its own: each row equals
    dense attention over its last 7 positions (the numba kernel and the BLAS path alike)."""
    window, scale, n, first = 7, 0.3, 30, 9
    k_cache, v_cache = randn(12, BS, N_KV, HD), randn(12, BS, N_KV, HD)
    table = np.arange(12, dtype=np.int32)[None]
    positions = np.arange(first, first + n, dtype=np.int32)
    seq_of_token = np.zeros(n, np.int32)
    qkv = randn(n, N_HEADS * HD + 2 * N_KV * HD)
    keys = k_cache.reshape(-1, N_KV, HD).astype(np.float64)
    values = v_cache.reshape(-1, N_KV, HD).astype(np.float64)
    want = np.empty((n, N_HEADS * HD))
    for t, pos in enumerate(positions):
        lo = pos + 1 - window
        for h in range(N_HEADS):
            kvh = h // (N_HEADS // N_KV)
            s = keys[lo : pos + 1, kvh] @ qkv[t, h * HD : (h + 1) * HD] * scale
            p = np.exp(s - s.max())
            want[t, h * HD : (h + 1) * HD] = (p / p.sum()) @ values[lo : pos + 1, kvh]
    for min_run in (None, 16):
        plan = attention.plan(seq_of_token, min_run)
        out = np.full((n, N_HEADS * HD), np.nan, np.float32)
        attention.attend(
            qkv,
            plan,
            seq_of_token,
            positions,
            table,
            K(k_cache),
            V(v_cache),
            N_HEADS,
            out,
            window,
            scale,
        )
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)

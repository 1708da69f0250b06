"""Elementwise and per-row operations of the llama block, over preallocated fp32 arrays."""

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def rmsnorm(x, w, eps, out):  # x (n, d), w (d,) -> out (n, d)
    n, dim = x.shape
    for t in prange(n):
        ss = np.float32(0.0)
        for i in range(dim):
            ss += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for i in range(dim):
            out[t, i] = x[t, i] * scale * w[i]


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def rope(x, positions, cos, sin, n_heads, head_dim):
    # x (n, >= n_heads * head_dim) rotated in place, rotate-half (NeoX/HF) layout;
    # positions (n,) int32; cos, sin (max_pos, head_dim // 2)
    half = head_dim // 2
    for t in prange(x.shape[0]):
        p = positions[t]
        for h in range(n_heads):
            base = h * head_dim
            for i in range(half):
                a = x[t, base + i]
                b = x[t, base + half + i]
                x[t, base + i] = a * cos[p, i] - b * sin[p, i]
                x[t, base + half + i] = b * cos[p, i] + a * sin[p, i]


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def silu_mul(gate_up, out):  # gate_up (n, 2 * f) = [gate | up] -> out (n, f) = silu(gate) * up
    n = gate_up.shape[0]
    f = out.shape[1]
    for t in prange(n):
        for i in range(f):
            g = gate_up[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, f + i]


@njit(parallel=True, cache=True, nogil=True)
def add_inplace(x, y):  # x (n, d) += y (n, d)
    for t in prange(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += y[t, i]


@njit(cache=True, nogil=True)
def gather_rows_f32(ids, table, out):  # ids (n,) -> out (n, d): embedding lookup
    for t in range(ids.shape[0]):
        out[t, :] = table[ids[t], :]

"""Matrix-times-activations for the weight types we serve, dequantized exactly inside the loop.

Layouts (rows are output features, blocks of 32 run along the input dimension):
  Q4_1: qs (N, K // 2) uint8 as in GGUF (byte j of a block holds element j in its low nibble
        and element j + 16 in its high nibble); d, m (N, K // 32) float32; w = d * q + m.
  Q8_0: qs (N, K) int8; d (N, K // 32) float32; w = d * q.
Activations and accumulation are fp32. These kernels serve the few-token (decode) case where
streaming the quantized bytes beats streaming fp32; big batches use BLAS on a dense copy.
"""

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True, fastmath=True)
def block_sums(x, xsum):  # x (n, K) -> xsum (n, K // 32)
    n, K = x.shape
    for t in range(n):
        for b in range(K // 32):
            s = np.float32(0.0)
            for j in range(32):
                s += x[t, b * 32 + j]
            xsum[t, b] = s


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def q4_1_matmul(x, xsum, qs, d, m, out):
    # x (n, K) float32; xsum (n, K // 32); qs (N, K // 2) uint8; d, m (N, K // 32); out (n, N)
    # sum_k (d q_k + m) x_k = d * sum_k q_k x_k + m * sum_k x_k, per block of 32.
    n = x.shape[0]
    N = qs.shape[0]
    nb = d.shape[1]
    for r2 in prange(N // 2):
        r = 2 * r2
        for t in range(n):
            acc0 = np.float32(0.0)
            acc1 = np.float32(0.0)
            for b in range(nb):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                for j in range(16):
                    xl = x[t, b * 32 + j]
                    xh = x[t, b * 32 + 16 + j]
                    q0 = np.float32(qs[r, b * 16 + j])
                    q1 = np.float32(qs[r + 1, b * 16 + j])
                    h0 = np.floor(q0 * np.float32(0.0625))
                    h1 = np.floor(q1 * np.float32(0.0625))
                    s0 += (q0 - np.float32(16.0) * h0) * xl + h0 * xh
                    s1 += (q1 - np.float32(16.0) * h1) * xl + h1 * xh
                acc0 += d[r, b] * s0 + m[r, b] * xsum[t, b]
                acc1 += d[r + 1, b] * s1 + m[r + 1, b] * xsum[t, b]
            out[t, r] = acc0
            out[t, r + 1] = acc1
    if N % 2:
        r = N - 1
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                s = np.float32(0.0)
                for j in range(16):
                    q = np.float32(qs[r, b * 16 + j])
                    h = np.floor(q * np.float32(0.0625))
                    s += (q - np.float32(16.0) * h) * x[t, b * 32 + j] + h * x[t, b * 32 + 16 + j]
                acc += d[r, b] * s + m[r, b] * xsum[t, b]
            out[t, r] = acc


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def q8_0_matmul(x, qs, d, out):
    # x (n, K) float32; qs (N, K) int8; d (N, K // 32); out (n, N)
    n = x.shape[0]
    N = qs.shape[0]
    nb = d.shape[1]
    for r2 in prange(N // 2):
        r = 2 * r2
        for t in range(n):
            acc0 = np.float32(0.0)
            acc1 = np.float32(0.0)
            for b in range(nb):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                for j in range(32):
                    xv = x[t, b * 32 + j]
                    s0 += np.float32(qs[r, b * 32 + j]) * xv
                    s1 += np.float32(qs[r + 1, b * 32 + j]) * xv
                acc0 += d[r, b] * s0
                acc1 += d[r + 1, b] * s1
            out[t, r] = acc0
            out[t, r + 1] = acc1
    if N % 2:
        r = N - 1
        for t in range(n):
            acc = np.float32(0.0)
            for b in range(nb):
                s = np.float32(0.0)
                for j in range(32):
                    s += np.float32(qs[r, b * 32 + j]) * x[t, b * 32 + j]
                acc += d[r, b] * s
            out[t, r] = acc


@njit(parallel=True, cache=True, nogil=True)
def dequantize_q4_1(qs, d, m, w):  # -> w (N, K) float32
    N, nb = d.shape
    for r in prange(N):
        for b in range(nb):
            for j in range(16):
                q = qs[r, b * 16 + j]
                w[r, b * 32 + j] = d[r, b] * np.float32(q & 15) + m[r, b]
                w[r, b * 32 + 16 + j] = d[r, b] * np.float32(q >> 4) + m[r, b]


@njit(parallel=True, cache=True, nogil=True)
def dequantize_q8_0(qs, d, w):  # -> w (N, K) float32
    N, nb = d.shape
    for r in prange(N):
        for b in range(nb):
            for j in range(32):
                w[r, b * 32 + j] = d[r, b] * np.float32(qs[r, b * 32 + j])

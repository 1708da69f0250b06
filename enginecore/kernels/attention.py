"""Paged attention over a flattened varlen batch: prefill chunks and decodes in one call.

KV cache of one layer: k_cache, v_cache (n_blocks, block_size, n_kv_heads, head_dim) float32.
A token's cache slot is block_table[pos // block_size] * block_size + pos % block_size.
"""

import math

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def store_kv(qkv, slot_mapping, q_dim, kv_dim, k_cache, v_cache):
    # qkv (n, q_dim + 2 * kv_dim) = [q | k | v]; slot_mapping (n,) int32
    n_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    block_size = k_cache.shape[1]
    for t in range(qkv.shape[0]):
        slot = slot_mapping[t]
        blk = slot // block_size
        off = slot % block_size
        for h in range(n_kv_heads):
            for i in range(head_dim):
                k_cache[blk, off, h, i] = qkv[t, q_dim + h * head_dim + i]
                v_cache[blk, off, h, i] = qkv[t, q_dim + kv_dim + h * head_dim + i]


@njit(parallel=True, cache=True, nogil=True, fastmath=True)
def paged_attention(qkv, seq_of_token, positions, block_tables, k_cache, v_cache, n_heads, out):
    # qkv (n, >= n_heads * head_dim): the roped queries come first
    # seq_of_token (n,) int32: row of block_tables for each token
    # positions (n,) int32: the token attends to positions 0..positions[t] (causal)
    # block_tables (n_seqs, max_blocks) int32; out (n, n_heads * head_dim)
    n = qkv.shape[0]
    block_size, n_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    group = n_heads // n_kv_heads
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for item in prange(n * n_kv_heads):
        t = item // n_kv_heads
        kvh = item % n_kv_heads
        s = seq_of_token[t]
        ctx = positions[t] + 1
        scores = np.empty((group, ctx), dtype=np.float32)
        for g in range(group):
            qbase = (kvh * group + g) * head_dim
            m = np.float32(-np.inf)
            for p in range(ctx):
                blk = block_tables[s, p // block_size]
                off = p % block_size
                acc = np.float32(0.0)
                for i in range(head_dim):
                    acc += qkv[t, qbase + i] * k_cache[blk, off, kvh, i]
                acc *= scale
                scores[g, p] = acc
                m = max(m, acc)
            total = np.float32(0.0)
            for p in range(ctx):
                e = np.exp(scores[g, p] - m)
                scores[g, p] = e
                total += e
            inv = np.float32(1.0) / total
            for i in range(head_dim):
                out[t, qbase + i] = np.float32(0.0)
            for p in range(ctx):
                blk = block_tables[s, p // block_size]
                off = p % block_size
                w = scores[g, p] * inv
                for i in range(head_dim):
                    out[t, qbase + i] += w * v_cache[blk, off, kvh, i]

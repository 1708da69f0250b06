"""Paged attention over a flattened varlen batch: prefill chunks and decodes in one call.

KV cache of one layer, float32 or uint16 holding fp16 bits (kv_cache_dtype = "f16": half the
bytes every decode streams): k_cache (n_blocks, n_kv_heads, head_dim, block_size), each block's
keys transposed so that a vector holds 16 positions (kernels/attention_simd.py), and v_cache
(n_blocks, n_kv_heads, block_size, head_dim). Both keep a block's rows of one kv head together,
so that attention reads each kv head's part of a block as one contiguous run.
A token's cache slot is block_table[pos // block_size] * block_size + pos % block_size.
A sliding-window layer (window > 0) lets the token at position p see positions
p - window + 1 .. p only; the query scale is the model's (1 / sqrt(head_dim) for most).

Two paths, chosen per sequence run by `plan`: the numba kernel (decodes, short chunks; one
item per token streams its context's K and V blocks once for all heads), and, for long
prefill chunks in a many-row step, sgemms per (query tile, head) over the gathered context,
called from numba's threads (kernels/gemm.py), with the causal softmax between them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba import njit, prange

from enginecore.kernels import gemm
from enginecore.kernels.attention_simd import (
    LANES,
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
from enginecore.kernels.claim import counters, next_item, shares_to_claim
from enginecore.kernels.f16 import kv_store
from enginecore.kernels.ops import FAST, fast_exp, lane_sum, lanes8_max

# Query tokens per GEMM tile of the BLAS path: smaller tiles skip more of the causal upper
# triangle (4 tiles of a 512-token chunk compute 62% of the full square) but make more calls.
QUERY_TILE = 128


# Fewer tokens than this keep a fixed split of paged_attention's items (kernels/claim.py): at
# ~10 us a token they make a region too short for claims across workers to pay.
CLAIM_MIN_TOKENS = 8

# Tokens stored on one thread below this many (a parallel region costs more than they do).
STORE_SERIAL_BELOW = 16

# A token whose visible positions reach into more than one run of SPAN_CHUNK positions (runs
# at multiples of SPAN_CHUNK) is attended run by run: each (token, heads, run) is an item of
# its own, so one long sequence gives every worker a share (a one-sequence decode had only its
# kv heads to share, 3 between 2 workers for SmolLM2), and each head's runs, each with its own
# maximum, sum and unnormalized weighted values, are joined in run order after the region. The
# runs are the token's own, never the batch's, so a token's result is the same bits in any
# batch; a token within one run is attended in one pass (normalized weights, then the values),
# as before. Runs of 256 made a one-sequence decode's attention at context 4096 0.90x the time
# but two or sixteen sequences' 1.10x (each run's items, its join); runs of 1024: 0.88x and
# 0.87x at contexts 4096 and 2048 alone, 1.01x and 0.99x for 2 and 16 sequences (bench.ab
# --cases attention --context N, bench/README.md).
SPAN_CHUNK = 1024


@njit(cache=True, nogil=True, inline="always")
def _store_tokens(qkv, t0, t1, slot_mapping, q_dim, kv_dim, k_cache, v_cache):
    n_kv_heads, head_dim, block_size = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    for t in range(t0, t1):
        slot = slot_mapping[t]
        blk = slot // block_size
        off = slot % block_size
        for h in range(n_kv_heads):
            for i in range(head_dim):
                k = qkv[t, q_dim + h * head_dim + i]
                v = qkv[t, q_dim + kv_dim + h * head_dim + i]
                k_cache[blk, h, i, off] = kv_store(k, k_cache[0, 0, 0, 0])
                v_cache[blk, h, off, i] = kv_store(v, v_cache[0, 0, 0, 0])


@njit(parallel=True, cache=True, nogil=True)
def store_kv(qkv, slot_mapping, q_dim, kv_dim, k_cache, v_cache, workers):
    # qkv (n, q_dim + 2 * kv_dim) = [q | k | v]; slot_mapping (n,) int32. A token's keys
    # land in head_dim cache lines (the K layout is transposed per block), each a miss
    # waiting for its line: many tokens are stored by `workers` threads, a contiguous share
    # each (a prefill's neighbours share blocks)
    n = qkv.shape[0]
    if n < STORE_SERIAL_BELOW:
        _store_tokens(qkv, 0, n, slot_mapping, q_dim, kv_dim, k_cache, v_cache)
        return
    step = -(-n // workers)
    for part in prange(workers):
        t0 = part * step
        _store_tokens(qkv, t0, min(n, t0 + step), slot_mapping, q_dim, kv_dim, k_cache, v_cache)


@njit(cache=True, nogil=True, inline="always")
def _fmax(a, b):
    return a if a > b else b


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _row_max(row):
    # max(row, -1e30) (not -inf: fastmath assumes finite values) as eight partial maxima in
    # one vector (ops.lanes8_max): a max is exact in any order, so this changes no bit, where
    # one running max was a chain of dependent vmaxss, 4 cycles an element and most of a
    # decode's softmax
    m0, m1, m2, m3, m4, m5, m6, m7 = lanes8_max(row)
    m = _fmax(_fmax(_fmax(m0, m1), _fmax(m2, m3)), _fmax(_fmax(m4, m5), _fmax(m6, m7)))
    end = row.shape[0] // 8 * 8
    for p in range(end, row.shape[0]):
        m = _fmax(m, row[p])
    return m


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _softmax_row(s, r, lo, lim, scale):
    # s[r, lo:lim] in place -> softmax(scale * s[r, lo:lim]). The loops index a view of the
    # span from 0: from a runtime first index numba cannot tell that an index is never
    # negative and wraps each one, which kept these loops from vectorizing (measured: a
    # 64-row decode's attention took 15.2 ms for 30 layers this way, 9.3 ms from 0)
    row = s[r, lo:lim]
    inv = np.float32(1.0) / _exp_row(row, scale)[1]
    for p in range(row.shape[0]):
        row[p] *= inv


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _exp_row(row, scale):
    # row in place -> exp(scale * (row - m)) for m its maximum; (m, the sum of the new row)
    m = _row_max(row)
    for p in range(row.shape[0]):
        row[p] = fast_exp((row[p] - m) * scale)
    return m, lane_sum(row, False)


@njit(cache=True, nogil=True, inline="always")
def _first_visible(pos, window):
    # the first position a token at `pos` attends to (window 0: the whole context)
    return max(pos + 1 - window, 0) if window > 0 else 0


@njit(cache=True, nogil=True, inline="always")
def _scores(qf, q0, kf, table, lo, ctx, n_kv, group, h0, h1, head_dim, bs, sf, s0, span, offs,
            cached):  # fmt: skip
    # sf[s0 + h span + p] = q[h] . k[p] for heads h0..h1-1 and the blocks of positions
    # lo..ctx-1 (whole 16-lane pieces: a few past ctx too); q[h] at qf[q0 + h head_dim:]; kf
    # the flat K cache; offs: 2 QK_BLOCKS int64 of scratch. Blocks of one vector (16
    # positions) go through qk_blocks: several blocks a tile when `cached` (the keys are read
    # by other rows of the batch too, a prefill's: in cache, the fma chains' latency bounds a
    # tile of one block), else one (a decode's keys stream from DRAM, block after block, and
    # several blocks' rows in turn measured slower)
    per_block = n_kv * head_dim * bs
    n_blocks = -(-ctx // bs)
    if bs == LANES:
        most = tile_vecs(min(QK_HEADS, group), QK_BLOCKS) if cached else 1
        for b0 in range(lo // bs, n_blocks, most):
            nb = min(most, n_blocks - b0)
            for kvh in range(h0 // group, -(-h1 // group)):
                at = kvh * head_dim * bs
                for c in range(nb):  # these blocks, then the ones after them to prefetch
                    offs[c] = table[b0 + c] * per_block + at
                    nxt = b0 + nb + c  # (past the last block: this one, asked for again)
                    offs[QK_BLOCKS + c] = table[nxt] * per_block + at if nxt < n_blocks else offs[c]
                g1 = min(h1 - kvh * group, group)
                for g0 in range(max(h0 - kvh * group, 0), g1, QK_HEADS):
                    heads = min(QK_HEADS, g1 - g0)
                    h = kvh * group + g0
                    q_at, s_at = q0 + h * head_dim, s0 + h * span + b0 * bs
                    vecs = tile_vecs(heads, QK_BLOCKS)
                    for c0 in range(0, nb, vecs):
                        pf = QK_BLOCKS if g0 == 0 else -1
                        qk_blocks(qf, q_at, head_dim, kf, offs[c0:], bs, head_dim, sf,
                                  s_at + c0 * bs, span, heads, min(vecs, nb - c0), pf)  # fmt: skip
        return
    for b in range(lo // bs, n_blocks):
        used = min(bs, ctx - b * bs)
        for kvh in range(h0 // group, -(-h1 // group)):
            k0 = table[b] * per_block + kvh * head_dim * bs
            # the next block's keys of this kv head, asked for while these are used
            ahead = table[b + 1] * per_block + kvh * head_dim * bs if b + 1 < n_blocks else -1
            g1 = min(h1 - kvh * group, group)
            for g0 in range(max(h0 - kvh * group, 0), g1, QK_HEADS):
                heads = min(QK_HEADS, g1 - g0)
                h = kvh * group + g0
                q_at, s_at = q0 + h * head_dim, s0 + h * span + b * bs
                if bs < LANES:
                    qk_scalar(qf, q_at, head_dim, kf, k0, bs, head_dim, sf, s_at, span, heads, bs)
                    continue
                vecs = tile_vecs(heads, 2)
                for p0 in range(0, used, vecs * LANES):
                    nv = min(vecs, -(-(used - p0) // LANES))
                    pf = ahead + p0 if ahead >= 0 and g0 == 0 else -1
                    qk_tile(qf, q_at, head_dim, kf, k0 + p0, bs, head_dim, sf, s_at + p0, span,
                            heads, nv, pf)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _weighted_values(sf, s0, span, vf, table, lo, ctx, n_kv, group, h0, h1, head_dim, bs, af,
                     a0):  # fmt: skip
    # af[a0 + h head_dim + d] += sum over p in lo..ctx-1, in order, of s[h, p] v[p, d], for
    # heads h0..h1-1
    row = head_dim  # a kv head's V rows of a block are consecutive
    n_blocks = -(-ctx // bs)
    for b in range(lo // bs, n_blocks):
        j0, j1 = max(lo - b * bs, 0), min(ctx - b * bs, bs)
        for kvh in range(h0 // group, -(-h1 // group)):
            v0 = ((table[b] * n_kv + kvh) * bs + j0) * row
            ahead = (table[b + 1] * n_kv + kvh) * bs * row if b + 1 < n_blocks else -1
            g1 = min(h1 - kvh * group, group)
            for g0 in range(max(h0 - kvh * group, 0), g1, PV_HEADS):
                heads = min(PV_HEADS, g1 - g0)
                h = kvh * group + g0
                w_at, a_at = s0 + h * span + b * bs + j0, a0 + h * head_dim
                if head_dim % LANES:
                    pv_scalar(sf, w_at, span, vf, v0, row, j1 - j0, af, a_at, head_dim, heads,
                              head_dim)  # fmt: skip
                    continue
                vecs = tile_vecs(heads, PV_VECS)
                for d0 in range(0, head_dim, LANES * vecs):
                    nv = min(vecs, (head_dim - d0) // LANES)
                    pf = ahead + d0 if ahead >= 0 and g0 == 0 else -1
                    pv_tile(sf, w_at, span, vf, v0 + d0, row, j1 - j0, af, a_at + d0, head_dim,
                            heads, nv, pf)  # fmt: skip


@njit(cache=True, nogil=True)
def paged_attention(
    qkv, tokens, seq_of_token, positions, block_tables, k_cache, v_cache, n_heads, out, workers,
    window, scale,
):  # fmt: skip
    # qkv (n, >= n_heads * head_dim): the roped queries come first; tokens (m,) int32: the
    # rows to attend for; seq_of_token (n,) int32: row of block_tables for each token;
    # positions (n,) int32: token t attends to 0..positions[t] (the last `window` of them when
    # window > 0); out (n, n_heads * head_dim); scale: of q.k before the softmax
    # One item per token, all heads: a block's K (and V) rows of every kv head sit together
    # in the cache, so an item streams each block as one contiguous run, which the hardware
    # prefetcher follows. Fewer tokens than workers (a decode of one sequence): one item per
    # (token, kv head), so that every worker has a share (splitting a kv head's group of
    # queries further loses the tiles' shared K loads, and measured no faster). Each head's
    # scores and sums are the same operations in the same order either way, so the split
    # never changes a bit.
    # A long context is split into runs of positions (SPAN_CHUNK), each run an item per
    # (token, heads) and the runs joined after the region (_join_runs).
    # Each worker claims the items of its share one by one, then what is left of the others'
    # (kernels/claim.py): contexts differ, and a worker may be descheduled. Two passes over a
    # scores row (q.k, then softmax and v) measured 2.7x faster than an online softmax
    # rescaling per block.
    # Arrays are made here, outside the parallel function: one made inside costs its region
    # ~1.7 us, a tenth of a one-token decode's attention.
    head_dim, bs, n_kv = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    n_tokens = tokens.shape[0]
    per_item = n_heads // n_kv if n_tokens < workers else n_heads  # heads per item
    groups = n_heads // per_item
    # token k's items: first_item[k] .. first_item[k + 1] - 1, `groups` per run (SPAN_CHUNK)
    first_item = np.empty(n_tokens + 1, np.int64)
    first_item[0] = 0
    rows_of = np.zeros(block_tables.shape[0], np.int32)  # each sequence's rows in the batch
    max_ctx, runs = 1, 0
    for k in range(n_tokens):
        pos = positions[tokens[k]]
        max_ctx = max(max_ctx, pos + 1)
        n_runs = pos // SPAN_CHUNK - _first_visible(pos, window) // SPAN_CHUNK + 1
        runs = max(runs, n_runs)
        first_item[k + 1] = first_item[k] + groups * n_runs
        rows_of[seq_of_token[tokens[k]]] += 1
    span = -(-max_ctx // bs) * bs  # a scores row holds whole blocks
    # scratch per worker (a few KB, it stays in cache); flat views for the vector tiles
    acc = np.empty((workers, n_heads, head_dim), np.float32)
    qs = np.empty((workers, n_heads, head_dim), np.float32)
    score = np.empty((workers, n_heads, span), np.float32)
    offs = np.empty((workers, 2 * QK_BLOCKS), np.int64)  # a q.k tile's blocks (_scores)
    # each item's heads' maximum, sum and weighted values, when its token has several runs
    n_parts = first_item[n_tokens] if runs > 1 else 0
    part_m = np.empty((n_parts, per_item), np.float32)
    part_l = np.empty((n_parts, per_item), np.float32)
    part_o = np.empty((n_parts, per_item, head_dim), np.float32)
    _paged_attention(
        qkv, tokens, seq_of_token, positions, block_tables, k_cache.reshape(-1),
        v_cache.reshape(-1), n_kv, n_heads, head_dim, bs, out, workers, window, scale, acc,
        qs, score, span, counters(workers), first_item, per_item, part_m, part_l, part_o, offs,
        rows_of,
    )  # fmt: skip
    if runs > 1:
        _join_runs(tokens, first_item, per_item, part_m, part_l, part_o, out, acc, workers)


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def _paged_attention(
    qkv, tokens, seq_of_token, positions, block_tables, kf, vf, n_kv, n_heads, head_dim, bs,
    out, workers, window, scale, acc, qs, score, span, claimed, first_item, per_item, part_m,
    part_l, part_o, offs, rows_of,
):  # fmt: skip
    # paged_attention's work, its K and V caches flat (kf, vf), its scratch and counters made
    group = n_heads // n_kv
    n_tokens = tokens.shape[0]
    groups = n_heads // per_item
    n_items = first_item[n_tokens]
    af, qf, sf = acc.reshape(-1), qs.reshape(-1), score.reshape(-1)
    n_chunks = n_items if n_tokens >= CLAIM_MIN_TOKENS else workers  # one item a chunk
    for w in prange(workers):
        q, sc, a = qs[w], score[w], acc[w]
        q0, s0 = w * n_heads * head_dim, w * n_heads * span
        while True:
            item = next_item(claimed, w, n_items, shares_to_claim(n_chunks, workers))
            if item < 0:
                break
            k = np.searchsorted(first_item, item, side="right") - 1
            t = tokens[k]
            run, g = divmod(item - first_item[k], groups)
            h0 = g * per_item
            h1 = h0 + per_item
            s = seq_of_token[t]
            ctx = positions[t] + 1
            lo = _first_visible(positions[t], window)
            whole = first_item[k + 1] - first_item[k] == groups  # one run
            if not whole:  # this item's run of the visible positions
                r0 = (lo // SPAN_CHUNK + run) * SPAN_CHUNK
                lo, ctx = max(lo, r0), min(ctx, r0 + SPAN_CHUNK)
            for h in range(h0, h1):
                for i in range(head_dim):
                    q[h, i] = qkv[t, h * head_dim + i] * np.float32(scale)
                    a[h, i] = np.float32(0.0)
            table = block_tables[s]
            _scores(qf, q0, kf, table, lo, ctx, n_kv, group, h0, h1, head_dim, bs, sf, s0,
                    span, offs[w], rows_of[s] > 1)  # fmt: skip
            for h in range(h0, h1):  # q was scaled already
                if whole:
                    _softmax_row(sc, h, lo, ctx, np.float32(1.0))
                else:
                    part_m[item, h - h0], part_l[item, h - h0] = _exp_row(
                        sc[h, lo:ctx], np.float32(1.0)
                    )
            _weighted_values(sf, s0, span, vf, table, lo, ctx, n_kv, group, h0, h1, head_dim,
                             bs, af, q0)  # fmt: skip
            if not whole:
                part_o[item] = a[h0:h1]
                continue
            for h in range(h0, h1):
                for i in range(head_dim):
                    out[t, h * head_dim + i] = a[h, i]


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def _join_runs(tokens, first_item, per_item, part_m, part_l, part_o, out, acc, workers):
    # the split tokens' runs (paged_attention), per head in run order: each run's weighted
    # values and sum scaled by exp(its maximum - the head's), then the values over the sum
    n_heads, head_dim = acc.shape[1], acc.shape[2]
    groups = n_heads // per_item
    for w in prange(workers):
        o = acc[w, 0]
        for th in range(w, tokens.shape[0] * n_heads, workers):
            k, h = divmod(th, n_heads)
            n_runs = (first_item[k + 1] - first_item[k]) // groups
            if n_runs == 1:
                continue
            g, j = divmod(h, per_item)
            at = first_item[k] + g
            m = np.float32(-1e30)
            for run in range(n_runs):
                m = max(m, part_m[at + run * groups, j])
            total = np.float32(0.0)
            o[:] = np.float32(0.0)
            for run in range(n_runs):
                i = at + run * groups
                f = fast_exp(part_m[i, j] - m)
                total += part_l[i, j] * f
                for d in range(head_dim):
                    o[d] += part_o[i, j, d] * f
            inv = np.float32(1.0) / total
            for d in range(head_dim):
                out[tokens[k], h * head_dim + d] = o[d] * inv


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _causal_softmax(s, first_pos, scale, window):
    # s (rows, ctx) q.k scores, in place -> softmax(scale * s) over the keys row r sees
    # (0..first_pos + r, or its last `window` when window > 0), zero elsewhere
    rows, ctx = s.shape
    for r in range(rows):
        lim = min(first_pos + r + 1, ctx)
        lo = _first_visible(first_pos + r, window)
        s[r, :lo] = np.float32(0.0)
        _softmax_row(s, r, lo, lim, scale)
        s[r, lim:] = np.float32(0.0)  # a view from 0, as in _softmax_row


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def chunk_attention(qkv, first, end, first_pos, keys, values, n_heads, out, workers, window, scale):
    # Rows first..end-1 of qkv / out are consecutive positions first_pos.. of one sequence;
    # keys, values (>= its context, n_kv, head_dim): its cache blocks, gathered. One item per
    # (query tile, head): two single-threaded sgemms into a scratch scores tile, the causal
    # softmax between them, the second writing straight into out's columns of the head.
    # Workers take items round-robin, so each gets a share of every tile's heads.
    n_kv, head_dim = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    n_items = n_heads * -(-(end - first) // QUERY_TILE)
    for w in prange(workers):
        for item in range(w, n_items, workers):
            h, tile = item % n_heads, item // n_heads
            ta = first + tile * QUERY_TILE
            tb = min(ta + QUERY_TILE, end)
            pos0 = first_pos + tile * QUERY_TILE
            c = pos0 + tb - ta  # the tile sees no key beyond its last query
            cols = h * head_dim
            s = np.empty((tb - ta, c), np.float32)
            gemm.sgemm_serial(qkv[ta:tb, cols : cols + head_dim], keys[:c, h // group], s, True)
            _causal_softmax(s, pos0, np.float32(scale), window)
            gemm.sgemm_serial(s, values[:c, h // group], out[ta:tb, cols : cols + head_dim], False)


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    kernel_tokens: npt.NDArray[np.int32]  # rows attended by the numba kernel
    runs: list[tuple[int, int, int]]  # (first row, end row, sequence) attended by BLAS


def plan(
    seq_of_token: npt.NDArray[np.int32],
    min_run: int | None,
    positions: npt.NDArray[np.int32] | None = None,
) -> AttentionPlan:
    """Send each sequence's run of >= min_run rows to the BLAS path (None: never). Given the
    rows' positions, the kernel's rows go longest context first: its workers claim them in
    order, each from its own share and then from the other's, so the rows left for the last
    claims are the short ones and the workers end closer together (a 512-token prefill's
    attention claimed its longest rows last; each row's result is the same in any order)."""
    n = seq_of_token.shape[0]
    runs: list[tuple[int, int, int]] = []
    rest = np.arange(n, dtype=np.int32)
    if min_run is not None and n >= min_run:
        bounds = [0, *(np.flatnonzero(np.diff(seq_of_token)) + 1).tolist(), n]
        kept: list[int] = []
        for a, b in itertools.pairwise(bounds):
            if b - a >= min_run:
                runs.append((a, b, int(seq_of_token[a])))
            else:
                kept.extend(range(a, b))
        rest = np.asarray(kept, np.int32)
    if positions is not None:
        rest = rest[np.argsort(-positions[rest], kind="stable")]
    return AttentionPlan(rest, runs)


def k_cache_layout(keys: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Keys in blocks (n_blocks, block_size, n_kv_heads, head_dim) as the K cache holds them."""
    return np.ascontiguousarray(keys.transpose(0, 2, 3, 1))


def k_positions(k_cache: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Blocks of the K cache's layout as (n_blocks * block_size, n_kv_heads, head_dim) keys."""
    return k_cache.transpose(0, 3, 1, 2).reshape(-1, k_cache.shape[1], k_cache.shape[2])


def v_cache_layout(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Values in blocks (n_blocks, block_size, n_kv_heads, head_dim) as the V cache holds them."""
    return np.ascontiguousarray(values.transpose(0, 2, 1, 3))


def v_positions(v_cache: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Blocks of the V cache's layout as (n_blocks * block_size, n_kv_heads, head_dim) values."""
    return v_cache.transpose(0, 2, 1, 3).reshape(-1, v_cache.shape[1], v_cache.shape[3])


def _as_f32(a: npt.NDArray[np.float32] | npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    if a.dtype == np.float32:
        return a  # type: ignore[return-value]
    return a.view(np.float16).astype(np.float32)


def attend(
    qkv: npt.NDArray[np.float32],
    p: AttentionPlan,
    seq_of_token: npt.NDArray[np.int32],
    positions: npt.NDArray[np.int32],
    block_tables: npt.NDArray[np.int32],
    k_cache: npt.NDArray[np.float32] | npt.NDArray[np.uint16],
    v_cache: npt.NDArray[np.float32] | npt.NDArray[np.uint16],
    n_heads: int,
    out: npt.NDArray[np.float32],
    window: int = 0,
    scale: float | None = None,
) -> None:
    """out (n, n_heads * head_dim) = softmax(scale q k^T) v over each token's context (its last
    `window` positions when window > 0); scale defaults to 1 / sqrt(head_dim)."""
    if scale is None:
        scale = 1.0 / math.sqrt(k_cache.shape[2])  # head_dim
    if p.kernel_tokens.shape[0]:
        paged_attention(
            qkv, p.kernel_tokens, seq_of_token, positions, block_tables, k_cache, v_cache,
            n_heads, out, numba.get_num_threads(), window, scale,
        )  # fmt: skip
    block_size = k_cache.shape[3]
    for first, end, seq in p.runs:
        table = block_tables[seq, : -(-(int(positions[end - 1]) + 1) // block_size)]
        keys = _as_f32(k_positions(k_cache[table]))  # gathered
        values = _as_f32(v_positions(v_cache[table]))
        workers = numba.get_num_threads()
        chunk_attention(
            qkv, first, end, int(positions[first]), keys, values, n_heads, out, workers,
            window, scale,
        )  # fmt: skip

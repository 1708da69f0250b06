"""The panel format of quantized weights, and its integer-mode matmul.

`fmt` is one matrix's panels: (lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min).

Every GGUF type is decoded at load into one kernel format (enginecore/loader/gguf_types.py):
small unsigned integers `v` with a per-type offset, in 16-row panels (layout: kernels/dot.py;
`lanes` is a panel's bytes viewed as one uint32 (4 bytes per row, int8 activations and exact
mode) or uint16 (int16 activations: 2 bytes per row, or two words with 4-bit weights) per
row and group; 5-bit values: 4-bit lanes and their fifth bits in hb, HIGH_BYTES per group;
8-bit values with int16 activations: v - off as int8), and per row:

  d  (P, n_super, 16) uint16: fp16 bits of the super-block scale
  dm (P, n_super, 16) uint16: fp16 bits of the super-block minimum (n_super = 0: none)
  isc, imn (P, n_sub, 16) int8: integer sub-block scale and minimum (n_sub = 0: super = sub)

so that weight = sc * (v - off) + mn, with sc = d * isc and mn = dm * imn per sub-block of
`sub` (16 or 32) values, exactly as gguf.quants.dequantize computes it.

Integer modes: activations quantized per block (`act_block`: 16 values for int8, 32 for
int16) to int8 or int16 (scale xa; xb, the sums of each 16 and each 32 dequantized values),
each panel's exact int32 sums per sub-block, or per activation block when that is shorter,
from kernels/dot.py (or the portable loop here; with int16 activations Q5_0's and the 8-bit
types' of v - off), then per output element, in one fixed order, float32 multiplies, adds and
fused multiply-adds (kernels/simd.py's docstring): the same bits for any row count, thread
split or ISA path. Exact mode and the embedding lookups: kernels/dequant.py.
"""

from typing import Any

import numpy as np
from numba import njit, prange
from numba.extending import overload

from enginecore.kernels.claim import (
    counters,
    done_wait,
    next_item,
    num_chunks,
    shares_to_claim,
    sync_add,
)
from enginecore.kernels.dot import ACT_ROWS, HIGH_BYTES, isa_of, runs_portable
from enginecore.kernels.f16 import f16_bits_to_f32
from enginecore.kernels.simd import (
    DOUBLE,
    DOUBLE_ISA,
    EIGHT,
    FIVE,
    FIVE_SIGNED,
    FOUR,
    NO_WIDE_INT16_ISA,
    ROWS,
    WIDE,
    WORDS,
    WORDS_ISA,
    fma32,
    panel_kernel,
    quantize_block,
    unpack_words_4,
    unpack_words_5,
)

LANES = 16  # output rows per panel
# activation rows from which int16 activations on AVX2 unpack each 5-bit (4-bit) panel to
# words once (kernels/simd.py's unpack_words) rather than in every kernel call of ROWS rows.
# bench.ab --cases matmul against 656c3c3, AVX2 proxy (bench/isa.py), same bits: Q5_K at the
# bundled model's shapes 0.80-0.86x the time at 8 rows, 0.64-0.70x at 32, 0.55-0.64x at 64;
# Q4_1 and Q4_K 1.06-1.28x at 8 rows, 0.95-1.02x at 32, 0.94-0.99x at 64 (their unpack is a
# small part of a row's work, kernels/simd.py's WORDS kind: the words' stores and reloads cost
# about as much below 64 rows)
WORDS_ROWS_5, WORDS_ROWS_4 = 8, 64
# 4-bit panels of rows no longer than WORDS_SHORT_K values unpack from WORDS_SHORT_ROWS rows:
# their words (32 K bytes, 24 KB at most) stay in L1 across the row groups. bench.ab --base
# 3b3de65 on the AVX2 proxy, same bits: --cases matmul at 16 and 32 rows, Q4_1 and Q4_K of K =
# 576 0.90-0.95x the time, of K = 1536 (48 KB of words) 0.95-1.01x; --cases steps from 16
# rows, decode B=16 1.03x / 1.05x best (and 1.015x without the unpack's prefetch), from 32 rows
# B=16 1.00x, B=32 0.96x / 0.99x in two runs
WORDS_SHORT_K, WORDS_SHORT_ROWS = 768, 32


@njit(cache=True, nogil=True, inline="always")
def sub_scales(d, dm, isc, imn, p, sps, has_min, j, r):
    # (sc, mn) of sub-block j of row r of panel p
    sc = f16_bits_to_f32(d[p, j // sps, r])
    mn = np.float32(0.0)
    if has_min:
        mn = f16_bits_to_f32(dm[p, j // sps, r])
    if sps > 1:
        sc = sc * np.float32(isc[p, j, r])
        if has_min:
            mn = mn * np.float32(imn[p, j, r])
    return sc, mn


@njit(cache=True, nogil=True, inline="always")
def panel_scales(d, dm, isc, imn, p, sps, has_min, sc, mn):
    # sc, mn (n_sub, 16) float32 of panel p
    for j in range(sc.shape[0]):
        for r in range(LANES):
            sc[j, r], mn[j, r] = sub_scales(d, dm, isc, imn, p, sps, has_min, j, r)


# Activations quantized on one thread below this many values (~0.7 ns a value: a parallel
# region costs ~3 us).
QUANTIZE_SERIAL_VALUES = 1 << 14

# quantize_matmul quantizes inside the matmul's parallel region from this many values on;
# fewer (a decode of a few sequences: 1 x 576 takes ~0.5 us) are quantized on the calling
# thread first: claimed in the region, with the workers' waits, decode steps of one sequence
# took 1.04-1.06x the time (bench.ab), those of 16 0.96-0.97x
FUSED_QUANTIZE_VALUES = 1 << 12

# int_matmul's workers claim panels in chunks of at least this many multiply-adds (panels x 16
# x K x rows; one panel at least): a one-row chunk of 7 panels of K = 576 streams 35 KB; and
# a matmul of fewer multiply-adds in all keeps a fixed split (kernels/claim.py): at one row,
# the layer matrices of the bundled model (~10-20 us); from 4 rows on, none of them
CLAIMED_MACS = 1 << 22
CHUNK_MACS = 1 << 16


@njit(cache=True, nogil=True, inline="always")
def act_block(xq):
    # activations per scale for xq's type: int8's rounding step is 258 times int16's, and
    # one large value sets the step of its whole block, so int8 blocks are 16 values (on
    # the bundled model's Q8_0 file this halves int8's mean KL against 32), int16 ones 32
    return 16 if xq.itemsize == 1 else 32


@njit(cache=True, nogil=True, inline="always")
def per_word(xq):
    # activations in one 4-byte word of xq (kernels/dot.py's interleaved layout)
    return 4 // xq.itemsize


@njit(cache=True, nogil=True, inline="always")
def act_row(xq, t):
    # (flat element of row t's first activation in xq, elements from one of its words to the
    # next) in kernels/dot.py's ACT_ROWS layout
    n, K = xq.shape
    g = t // ACT_ROWS
    return g * ACT_ROWS * K + (t % ACT_ROWS) * per_word(xq), min(ACT_ROWS, n - g * ACT_ROWS)


@njit(cache=True, nogil=True, inline="always")
def act_index(xq, t, k):
    # xq's index of row t's activation k (kernels/dot.py's ACT_ROWS layout)
    e = per_word(xq)
    first, rows = act_row(xq, t)
    flat = first + (k // e) * rows * e + k % e
    return flat // xq.shape[1], flat % xq.shape[1]


@njit(cache=True, nogil=True, inline="always")
def xb_index(K, sub, j):
    # xb's row of sub-block j of `sub` (16 or 32) values, for activation rows of K values:
    # each 16 values' sum of xq times its scale (rows 0 .. K / 16 - 1), then each 32's, as the
    # scaled sum over their one block (int16) or the two blocks' sums added (int8)
    return j if sub == 16 else K // 16 + j


@njit(cache=True, nogil=True, inline="always")
def _quantize_row(x, t, qmax, xq, xa, xb, words, b0, b1):
    # row t of x (n, K) float32 -> row t of xq = round(x / xa) (int8 / int16, in kernels/
    # dot.py's ACT_ROWS layout; words: xq's data as int32), column t of xa (K // act_block,
    # n), the block scales max|x| / qmax, and of xb, the sums of its dequantized values per 16
    # and per 32 (xb_index), for its blocks b0 .. b1 - 1 (of act_block values); each block
    # rounded by kernels/simd.py's quantize_block
    ab = act_block(xq)
    e = per_word(xq)
    first, rows = act_row(xq, t)
    w0 = first // e  # the row's first word (numba's // and % are Python's: hoisted by hand)
    K = x.shape[1]
    wpb = ab // e  # words per block
    for blk in range(b0, b1):
        amax, s0, s1 = quantize_block(x, t * K + blk * ab, qmax, xq, words,
                                      w0 + blk * wpb * rows, rows)  # fmt: skip
        scale = amax / np.float32(qmax)
        xb[xb_index(K, 16, blk * (ab // 16)), t] = scale * np.float32(s0)
        if ab == 32:
            xb[xb_index(K, 16, blk * 2 + 1), t] = scale * np.float32(s1)
            xb[xb_index(K, 32, blk), t] = scale * np.float32(s0 + s1)
        elif blk % 2 == 1:  # int8: the two blocks' sums, added
            xb[xb_index(K, 32, blk // 2), t] = xb[blk - 1, t] + xb[blk, t]
        xa[blk, t] = scale


@njit(cache=True, nogil=True)
def _quantize_serial(x, qmax, xq, xa, xb):
    # quantize_rows on this thread
    words = xq.reshape(xq.size).view(np.int32)
    n_blocks = x.shape[1] // act_block(xq)
    for t in range(x.shape[0]):
        _quantize_row(x, t, qmax, xq, xa, xb, words, 0, n_blocks)


@njit(cache=True, nogil=True)
def quantize_rows(x, qmax, xq, xa, xb, workers):
    # x (n, K) float32 -> xq (n, K) in kernels/dot.py's ACT_ROWS layout, xa (K // act_block,
    # n), xb (K // 16 + K // 32, n): _quantize_row. Many values: the workers claim 32-value
    # units of every row (quantize_units), not rows: neighbouring rows' words, scales and sums
    # share cache lines (kernels/dot.py's layout, xa's and xb's columns), and two workers
    # writing them made a 16-row quantization 2x slower than one thread alone
    if x.size < QUANTIZE_SERIAL_VALUES or workers < 2:
        _quantize_serial(x, qmax, xq, xa, xb)
    else:
        _quantize_claimed(x, qmax, xq, xa, xb, counters(workers))


@njit(parallel=True, cache=True, nogil=True)
def _quantize_claimed(x, qmax, xq, xa, xb, claimed):
    for w in prange(claimed.shape[0]):
        quantize_units(w, x, qmax, xq, xa, xb, claimed)


@njit(cache=True, nogil=True, inline="always")
def group_values(lanes, four_bit):
    # values of k in one group of 16 rows (kernels/dot.py's group_layout)
    return 8 if four_bit else lanes.itemsize


@njit(cache=True, nogil=True, inline="always")
def high_bit(hb, p, g, part, lane, part_lanes):
    # 16 if the fifth bit of lane `lane` of part `part` of group g of panel p is set
    # (kernels/dot.py's 5-bit layout), 0 if not or hb holds none (other widths)
    if hb.shape[1] == 0:
        return 0
    i = part * part_lanes + lane
    return 16 * ((np.int64(hb[p, g * HIGH_BYTES + i // 8]) >> (i % 8)) & 1)


@njit(cache=True, nogil=True, inline="always")
def _portable_sums(lanes, hb, p, g0, n_groups, four_bit, xq, t, k0, s16, fold):
    # s16 (16,) int32 = the panel's integer sums over groups g0.. against xq[t, k0..]; the
    # int16 layout's 4- and 5-bit values less `fold` (kernels/simd.py's SIGNED_FIVE: Q5_0 as
    # v - 16), its 8-bit ones as they are stored (v - off)
    il = lanes.itemsize
    per_group = group_values(lanes, four_bit)
    for r in range(LANES):
        s16[r] = 0
    for g in range(n_groups):
        kg = k0 + g * per_group
        for r in range(LANES):
            s = 0
            if four_bit and il == 2:  # two words per row: nibble q of word e is kg + 2q + e
                for e in range(2):
                    w = np.int64(lanes[p, (g0 + g) * 2 * LANES + 2 * r + e])
                    for q in range(4):
                        v = ((w >> (4 * q)) & 15) + high_bit(hb, p, g0 + g, q, 2 * r + e, 32)
                        v -= fold
                        s += v * xq[act_index(xq, t, kg + 2 * q + e)]
                s16[r] += s
                continue
            w = np.int64(lanes[p, (g0 + g) * LANES + r])
            for b in range(il):
                if four_bit:
                    lo = ((w >> (8 * b)) & 15) + high_bit(hb, p, g0 + g, 0, il * r + b, 64)
                    hi = ((w >> (8 * b + 4)) & 15) + high_bit(hb, p, g0 + g, 1, il * r + b, 64)
                    s += lo * xq[act_index(xq, t, kg + b)]
                    s += hi * xq[act_index(xq, t, kg + il + b)]
                else:  # int16 panels hold v - off as int8 (kernels/dot.py)
                    v = (w >> (8 * b)) & 255
                    if il == 2 and v > 127:
                        v -= 256
                    s += v * xq[act_index(xq, t, kg + b)]
            s16[r] += s


def portable_row(isa: Any, *args: Any) -> None:
    # _portable_row(*args) where a kernel's `isa` argument can be the portable path (an int,
    # or a Path naming it); nothing where its type names a SIMD path, so that numba's own
    # passes over a region compiled for one path never see the portable loops: they were
    # half of a cold start's compile of _int_matmul (41 -> 18 s on the AVX-512 path, 40 -> 24
    # on AVX2: bench/README.md, session 36)
    raise NotImplementedError("called from jitted code only")


@overload(portable_row)
def _portable_row_for(isa, *args):
    if runs_portable(isa):
        return lambda isa, *args: _portable_row(*args)
    return lambda isa, *args: None


@njit(cache=True, nogil=True)
def _portable_row(lanes, hb, d, dm, isc, imn, p, four_bit, off, signed, sub, sps, has_min, xq,
                  xa, xb, t, acc):  # fmt: skip
    # acc (16,) = panel p's rows times activation row t, in panel_kernel's order of operations
    # (kernels/simd.py's docstring): per sub-block P = a * S (then P = fma(a, S, P) for each
    # further activation block inside it), tmp = fma(c, xb, sc * P) (c = fma(-off, sc, mn),
    # xb its activations' sum), acc = acc + tmp; `signed` (SIGNED_FIVE) or 8-bit values with
    # int16 activations: S of v - off, and tmp = sc * P. (Its scratch and the panel's scales
    # made again for each row: the portable loop is the reference the paths are tested
    # against, and a SIMD path's matmul allocates nothing for it.)
    n_sub = xq.shape[1] // sub
    s16 = np.empty(LANES, np.int32)
    psum = np.empty(LANES, np.float32)
    sc = np.empty((n_sub, LANES), np.float32)
    mn = np.empty((n_sub, LANES), np.float32)
    panel_scales(d, dm, isc, imn, p, sps, has_min, sc, mn)
    fold = lanes.itemsize == 2 and (signed or not four_bit)
    per_group = group_values(lanes, four_bit)
    ab = act_block(xq)
    pieces = max(sub // ab, 1)
    plen = sub // pieces
    neg_off = np.float32(-off)
    K = xq.shape[1]
    acc[:] = 0
    for j in range(sc.shape[0]):
        for h in range(pieces):
            k0 = j * sub + h * plen
            _portable_sums(lanes, hb, p, k0 // per_group, plen // per_group, four_bit, xq, t,
                           k0, s16, off if fold and four_bit else 0)  # fmt: skip
            a = xa[k0 // ab, t]
            for r in range(LANES):
                fs = np.float32(s16[r])
                psum[r] = a * fs if h == 0 else fma32(a, fs, psum[r])
        for r in range(LANES):
            tmp = sc[j, r] * psum[r]
            if not fold:
                c = fma32(neg_off, sc[j, r], mn[j, r])
                tmp = fma32(c, xb[xb_index(K, sub, j), t], tmp)
            acc[r] = acc[r] + tmp


@njit(cache=True, nogil=True, inline="always")
def panel_kind(four_bit, five, signed):
    # kernels/simd.py's panel_kernel kind of a matrix's panels as packed (not words)
    return FIVE_SIGNED if signed else (FIVE if five else (FOUR if four_bit else EIGHT))


@njit(cache=True, nogil=True, inline="always")
def int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, parts):
    # out[t, col0 + row] for the matrix's n_rows rows (the last panel may hold padding) =
    # the sum over sub-blocks of sc * xa * S + c * xb (kernels/simd.py's docstring: its order
    # and roundings), S the exact int32 sum of v * xq over each activation block inside the
    # sub-block: kernels/simd.py's panel_kernel, or the same arithmetic in plain loops (isa 0).
    # _int_matmul's region with no values to quantize (x without rows; its unused counters
    # are `claimed` again). (The claims' counters are made out here: an array made inside a
    # parallel function costs its region ~1.7 us, more than a one-row matmul of a small
    # matrix gains from claims.) (np.int64: a caller's literal 0 would otherwise compile a
    # second specialization.)
    claimed = counters(parts)
    _int_matmul(np.empty((0, xq.shape[1]), np.float32), np.int64(0), xq, xa, xb, fmt, isa,
                out, np.int64(col0), n_rows, parts, claimed, claimed, claimed)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _matmul_worker(w, xq, xa, xb, fmt, isa, out, col0, n_rows, parts, claimed):
    # worker w's panels of _int_matmul: chunks of panels, claimed as it goes (kernels/claim.py)
    lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = xq.shape
    P = lanes.shape[0]
    n_sub = K // sub
    panel_bytes = lanes.shape[1] * lanes.itemsize
    five = hb.shape[1] > 0
    n_chunks = num_chunks(P, parts, LANES * K * n, CHUNK_MACS, CLAIMED_MACS)
    # 4- and 5-bit values unpacked to a panel of words (kernels/simd.py's WORDS kind), but
    # Q5_0's (SIGNED_FIVE), which AVX2 hosts pack as 8-bit (weights.five_as_eight_here)
    signed = five and off != 0 and not has_min
    by_words = isa_of(isa) == WORDS_ISA and xq.itemsize == 2 and four_bit and not signed
    rows_4 = WORDS_SHORT_ROWS if K <= WORDS_SHORT_K else WORDS_ROWS_4
    by_words = by_words and n >= (WORDS_ROWS_5 if five else rows_4)
    words = np.empty(LANES * K if by_words else 0, np.int16)
    acc = np.empty(DOUBLE * LANES, np.float32)
    while True:
        chunk = next_item(claimed, w, n_chunks, shares_to_claim(n_chunks, parts))
        if chunk < 0:
            break
        for p in range(chunk * P // n_chunks, (chunk + 1) * P // n_chunks):
            _panel(lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min, isa, xq, xa,
                   xb, p, n_sub, panel_bytes, five, signed, words, acc, out, col0,
                   n_rows)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _panel(lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min, isa, xq, xa, xb, p,
           n_sub, panel_bytes, five, signed, words, acc, out, col0, n_rows):  # fmt: skip
    # out[:, col0 + 16 p ..] = panel p times every activation row; `words` not empty: the
    # panel's values unpacked there first, then multiplied as words (_matmul_worker); `signed`:
    # kernels/simd.py's SIGNED_FIVE (Q5_0)
    n = xq.shape[0]
    code = isa_of(isa)  # (a constant for a dot.Path: the other paths' branches go)
    kind = panel_kind(four_bit, five, signed)
    if words.size > 0:
        n_groups = n_sub * sub // 8
        if five:
            unpack_words_5(lanes, p * panel_bytes, hb, p * hb.shape[1], n_groups, words)
        else:
            unpack_words_4(lanes, p * panel_bytes, hb, p * hb.shape[1], n_groups, words)
    t = 0
    while t < n:
        rows = 1
        if code == DOUBLE_ISA and t + DOUBLE <= n:
            rows = DOUBLE
        elif code != 0 and t + WIDE <= n and not (code == NO_WIDE_INT16_ISA and xq.itemsize == 2):
            rows = WIDE
        elif code != 0 and t + ROWS <= n:
            rows = ROWS
        if code == 0:
            portable_row(isa, lanes, hb, d, dm, isc, imn, p, four_bit, off, signed, sub, sps,
                         has_min, xq, xa, xb, t, acc)  # fmt: skip
        else:
            x_off, group = act_row(xq, t)  # the activations', scales' and sums' offsets
            s_off, sub_off = p * d.shape[1] * LANES, p * isc.shape[1] * LANES
            if words.size > 0:
                panel_kernel(WORDS, rows, isa, words, 0, hb, 0, xq, x_off, 4 * group, xa, t, xb,
                             t, d, dm, isc, imn, s_off, sub_off, sps, has_min, n_sub, sub, off,
                             acc)  # fmt: skip
            else:
                panel_kernel(kind, rows, isa, lanes, p * panel_bytes, hb, p * hb.shape[1], xq,
                             x_off, 4 * group, xa, t, xb, t, d, dm, isc, imn, s_off, sub_off, sps,
                             has_min, n_sub, sub, off, acc)  # fmt: skip
        for i in range(rows):
            for r in range(min(LANES, n_rows - p * LANES)):
                out[t + i, col0 + p * LANES + r] = acc[i * LANES + r]
        t += rows


@njit(cache=True, nogil=True, inline="always")
def act_buffers(n, K, kind):
    # (xq, xa, xb) for n activation rows of K values quantized to kind's type (quantize_rows)
    xq = np.empty((n, K), kind.dtype)
    xa = np.empty((K // act_block(xq), n), np.float32)
    xb = np.empty((K // 16 + K // 32, n), np.float32)
    return xq, xa, xb


@njit(cache=True, nogil=True)
def quantize(x, kind, qmax, workers):
    # x (n, K) float32 -> (xq, xa, xb) for int_matmul, xq of kind's type: quantize_rows
    x = np.ascontiguousarray(x)  # (quantize_block reads rows by flat offsets)
    xq, xa, xb = act_buffers(x.shape[0], x.shape[1], kind)
    quantize_rows(x, qmax, xq, xa, xb, workers)
    return xq, xa, xb


@njit(cache=True, nogil=True, inline="always")
def quantize_matmul(x, kind, qmax, fmt, isa, out, col0, n_rows, parts):
    # int_matmul of x (n, K) float32, quantized to kind's type in the same parallel region
    # (_int_matmul); returns the quantized activations (xq, xa, xb) for further
    # matrices of the same input
    x = np.ascontiguousarray(x)  # (quantize_block reads rows by flat offsets)
    xq, xa, xb = act_buffers(x.shape[0], x.shape[1], kind)
    if x.size < FUSED_QUANTIZE_VALUES:
        _quantize_serial(x, qmax, xq, xa, xb)
        int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, parts)
    else:
        _int_matmul(x, qmax, xq, xa, xb, fmt, isa, out, np.int64(col0), n_rows, parts,
                    counters(parts), counters(parts), counters(1))  # fmt: skip
    return xq, xa, xb


@njit(cache=True, nogil=True, inline="always")
def quantize_units(w, x, qmax, xq, xa, xb, claimed):
    # worker w's share of quantize_rows, claimed as it goes: 32-value units of every row (int8's
    # second block of 16 adds the first's sum, so a unit is both); returns how many it did
    per = 32 // act_block(xq)  # blocks of a unit
    n_units = x.shape[1] // 32
    words = xq.reshape(xq.size).view(np.int32)
    done = 0
    while True:
        u = next_item(claimed, w, n_units, claimed.shape[0])
        if u < 0:
            break
        for t in range(x.shape[0]):
            _quantize_row(x, t, qmax, xq, xa, xb, words, u * per, (u + 1) * per)
        done += 1
    return done


@njit(parallel=True, cache=True, nogil=True)
def _int_matmul(x, qmax, xq, xa, xb, fmt, isa, out, col0, n_rows, parts, c_quant, c_panels,
                done):  # fmt: skip
    # x's rows quantized (quantize_rows, when it has rows), then the matmul, one region: the
    # workers claim 32-value units of activations (every row's) from any share, wait until all
    # are quantized (kernels/claim.py's done_wait), then claim panels. A region's fork and join
    # cost ~2.5 us, and below QUANTIZE_SERIAL_VALUES the quantization ran on one thread while
    # the other waited. An item is 32 values of every row: int8's second block of 16 adds the
    # first's sum. int_matmul and quantize_matmul share this one region, so that the worker's
    # kernels (every panel kind's) are compiled once: each inlined copy took 35-49 s of a cold
    # start (kernels/simd.py's variants)
    for w in prange(parts):
        if x.shape[0] > 0:
            sync_add(done, 0, quantize_units(w, x, qmax, xq, xa, xb, c_quant))
            done_wait(done, x.shape[1] // 32)
        _matmul_worker(w, xq, xa, xb, fmt, isa, out, col0, n_rows, parts, c_panels)

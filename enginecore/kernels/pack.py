"""Load-time byte shuffles: the K-quants' values out of their GGUF blocks
(enginecore/loader/gguf_types.py), and decoded values into the panel layout (kernels/panels.py,
kernels/dot.py).

One pass over the values per matrix: numpy's reshapes, shifts, ors and transposed copies made
a temporary of the whole matrix at each step (a 1.7B-parameter Q4_K_M file: 8 of a 12.5 s
load). Rows past the last one (up to a whole panel) pack as values 0.

Bytes of panel p, for row r = 16 p + l and `il` bytes per row and group:
  4- and 5-bit values, group g of 8 values c = 8 g .. 8 g + 7 at byte ((g * 16 + l) * 4):
    il = 2: two little-endian words e = 0, 1, nibble q of word e holding value 8 g + 2 q + e
    il = 4: four bytes i = 0..3, value 8 g + i in the low nibble and 8 g + 4 + i in the high
  5-bit values also keep their fifth bits in hb: value c = 8 g + il q + e (q < 8 // il,
  e < il) is bit ((g * (8 // il) + q) * 16 + l) * il + e of the panel's bits, little-endian
  8-bit values, group j of il values at byte ((j * 16 + l) * il): value il j + i, plus `add`
  modulo 256 (int16 activations keep v - off as int8 bytes)
"""

import numpy as np
from numba import njit

from enginecore.kernels.panels import LANES

QK_K = 256  # values per K-quant super-block


@njit(cache=True, nogil=True)
def pack_four_bit(v, n_panels, il, five):
    # v (N, K) uint8 values (5-bit ones: < 32; the fifth bit goes to hb when five) ->
    # (lanes (n_panels, K * 8) bytes, hb (n_panels, 2 K or 0) bytes)
    n, k = v.shape
    groups = k // 8
    lanes = np.zeros((n_panels, groups * LANES * 4), np.uint8)
    hb = np.zeros((n_panels, 2 * k if five else 0), np.uint8)
    per_group = 8 // il
    for r in range(n):
        p, lane = r // LANES, r % LANES
        for g in range(groups):
            c0, o = 8 * g, (g * LANES + lane) * 4
            if il == 2:
                for e in range(2):
                    word = 0
                    for q in range(4):
                        word |= (int(v[r, c0 + 2 * q + e]) & 15) << (4 * q)
                    lanes[p, o + 2 * e] = word & 255
                    lanes[p, o + 2 * e + 1] = word >> 8
            else:
                for i in range(4):
                    lo, hi = int(v[r, c0 + i]) & 15, int(v[r, c0 + 4 + i]) & 15
                    lanes[p, o + i] = lo | (hi << 4)
            if five:
                for q in range(per_group):
                    for e in range(il):
                        if v[r, c0 + il * q + e] >> 4:
                            bit = ((g * per_group + q) * LANES + lane) * il + e
                            hb[p, bit >> 3] |= np.uint8(1 << (bit & 7))
    return lanes, hb


@njit(cache=True, nogil=True)
def pack_eight_bit(v, n_panels, il, add):
    # v (N, K) uint8 -> (n_panels, K * 16) bytes, each value plus `add` modulo 256
    n, k = v.shape
    lanes = np.empty((n_panels, k * LANES), np.uint8)
    for r in range(n_panels * LANES):
        p, lane = r // LANES, r % LANES
        for j in range(k // il):
            o = (j * LANES + lane) * il
            for i in range(il):
                value = int(v[r, il * j + i]) if r < n else 0
                lanes[p, o + i] = (value + add) & 255
    return lanes


@njit(cache=True, nogil=True)
def k_nibble_values(b, start, high_start):
    # Q4_K and Q5_K values (n, nb * 256) in one pass (numpy's stacks, shifts and ors made a
    # temporary of the matrix each: Q5_K decodes 2.8x faster so, Q4_K 1.15x). Chunk c of the
    # 128 bytes at `start`: byte i holds value 64 c + i (low nibble) and 64 c + 32 + i
    # (high). Q5_K: bit j of byte i of the 32 at high_start is value 32 j + i's fifth bit.
    n, nb = b.shape[0], b.shape[1]
    v = np.empty((n, nb * QK_K), np.uint8)
    for r in range(n):
        for block in range(nb):
            o = block * QK_K
            for c in range(4):
                for i in range(32):
                    byte = b[r, block, start + 32 * c + i]
                    v[r, o + 64 * c + i] = byte & 15
                    v[r, o + 64 * c + 32 + i] = byte >> 4
            if high_start >= 0:
                for j in range(8):
                    for i in range(32):
                        v[r, o + 32 * j + i] |= ((b[r, block, high_start + i] >> j) & 1) << 4
    return v


@njit(cache=True, nogil=True)
def q6_k_values(b):
    # Q6_K values (n, nb * 256): half s of a block is value 128 s + 32 q + i, for q < 4 and
    # i < 32; its low 4 bits are nibble q // 2 of byte 64 s + 32 (q % 2) + i of ql (the first
    # 128 bytes), its high 2 bits bits 2 q of byte 32 s + i of qh (the next 64)
    n, nb = b.shape[0], b.shape[1]
    v = np.empty((n, nb * QK_K), np.uint8)
    for r in range(n):
        for block in range(nb):
            o = block * QK_K
            for s in range(2):
                for q in range(4):
                    for i in range(32):
                        low = (b[r, block, 64 * s + 32 * (q % 2) + i] >> (4 * (q // 2))) & 15
                        high = (b[r, block, 128 + 32 * s + i] >> (2 * q)) & 3
                        v[r, o + 128 * s + 32 * q + i] = low | (high << 4)
    return v

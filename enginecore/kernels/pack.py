"""Packing decoded weights into the panel layout (kernels/panels.py, kernels/dot.py), at load.

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

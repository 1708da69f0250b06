"""The grammar mask on logits: tokens a request's grammar forbids get -inf before sampling.

A mask row is llguidance's bitmask: bit t % 32 of word t // 32 is set when token t may come
next. Words with every bit set (most of them inside a JSON string) cost one comparison.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def apply_token_bitmask(logits, rows, bitmask):  # logits (r, vocab), rows (k,), bitmask (k, words)
    vocab = logits.shape[1]
    neg_inf = np.float32(-np.inf)
    for i in range(rows.shape[0]):
        row = rows[i]
        for w in range(bitmask.shape[1]):
            bits = bitmask[i, w]
            if bits == -1:
                continue
            start = w * 32
            end = min(start + 32, vocab)
            for t in range(start, end):
                if (bits >> (t - start)) & 1 == 0:
                    logits[row, t] = neg_inf

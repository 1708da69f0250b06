"""The grammar-mask kernel against a numpy unpacking of the same bitmask."""

from __future__ import annotations

import numpy as np
import pytest

from enginecore.kernels.grammar_mask import apply_token_bitmask


def reference(logits: np.ndarray, rows: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    out = logits.copy()
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        bits = np.unpackbits(bitmask[i].view(np.uint8), bitorder="little")[:vocab]
        out[row, bits == 0] = -np.inf
    return out


@pytest.mark.parametrize("vocab", [32, 260, 1000, 49152])
def test_masked_rows_get_minus_infinity_exactly_where_a_bit_is_clear(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    words = -(-vocab // 32)
    logits = rng.normal(size=(6, vocab)).astype(np.float32)
    rows = np.array([0, 2, 3, 5], np.int32)
    bitmask = rng.integers(-(2**31), 2**31, size=(4, words), dtype=np.int64).astype(np.int32)
    bitmask[1] = -1  # everything allowed
    bitmask[2, : words // 2] = 0  # a run of forbidden words
    bitmask[3, 0] = 1  # token 0 alone in its word
    expected = reference(logits, rows, bitmask)
    apply_token_bitmask(logits, rows, bitmask)
    np.testing.assert_array_equal(logits, expected)
    assert np.isfinite(logits[[1, 4]]).all()  # unconstrained rows are untouched


def test_no_rows_is_a_no_op() -> None:
    logits = np.ones((2, 64), np.float32)
    apply_token_bitmask(logits, np.zeros(0, np.int32), np.zeros((0, 2), np.int32))
    assert (logits == 1).all()

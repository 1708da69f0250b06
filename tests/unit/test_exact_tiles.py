"""Exact mode at many rows: the panels dequantized into fp32 tiles for sgemm."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from enginecore.kernels import dequant, gemm, threads
from enginecore.loader import gguf_types
from enginecore.weights import EXACT_STREAM_MAX_ROWS, Numerics, PackedMatrix
from tests.fixtures.quant_blocks import FP16_FIELDS, random_blocks

Q = gguf.GGMLQuantizationType
TYPES = sorted(FP16_FIELDS, key=lambda t: t.name)
RNG = np.random.default_rng(23)


def packed(qtype: Q, rows: int, cols: int) -> tuple[PackedMatrix, np.ndarray]:
    raw = random_blocks(qtype, rows, cols, RNG)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), Numerics.EXACT)
    return m, gguf.quants.dequantize(raw, qtype).astype(np.float32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_tile_holds_the_weights_bit_for_bit(qtype: Q) -> None:
    m, w = packed(qtype, 53, 512)  # four panels, the last part-filled
    tile = np.full((512, 3 * 16 + 5), np.nan, np.float32)  # a wider buffer than the panels
    dequant.fill_tile(m._format(), 1, 4, tile)
    np.testing.assert_array_equal(tile[:, :37].view(np.uint32), w[16:].T.view(np.uint32))
    assert not tile[:, 37:48].any()  # the padding rows of the last panel are zero weights
    assert np.isnan(tile[:, 48:]).all()


@pytest.mark.skipif(not gemm.AVAILABLE, reason="numpy's BLAS has no cblas_sgemm to call")
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda t: t.name)
def test_many_rows_over_several_tiles_per_thread_equal_float64(qtype: Q) -> None:
    # two and a half tiles and a part-filled panel: each of two threads takes tiles in turn,
    # the last tile and panel are part-filled
    per_tile = dequant.TILE_BYTES // (256 * 16 * 4)
    rows = (2 * per_tile + per_tile // 2 + 1) * 16 - 7
    m, w = packed(qtype, rows, 256)
    x = RNG.standard_normal((EXACT_STREAM_MAX_ROWS + 24, 256)).astype(np.float32)
    out = np.full((x.shape[0], rows + 9), np.nan, np.float32)
    with threads.limited(2):
        m.matmul(x, out, 4)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(out[:, 4 : 4 + rows] - want).max() <= 2e-6 * np.abs(want).max()
    assert np.isnan(out[:, :4]).all() and np.isnan(out[:, 4 + rows :]).all()

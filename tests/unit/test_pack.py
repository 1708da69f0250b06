"""kernels/pack.py's one-pass packing gives the bytes of the numpy formulation it replaced
(reshapes, shifts and transposed copies: each step spelled out, the reference here)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from enginecore.kernels.pack import pack_eight_bit, pack_four_bit
from enginecore.kernels.panels import LANES


def numpy_pack(
    v: npt.NDArray[np.uint8], il: int, bits: int, add: int
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """(lanes, hb) as bytes, as enginecore/weights.py built them with numpy until 2026-12-06."""
    n, k = v.shape
    n_panels = -(-n // LANES)
    v = np.pad(v, ((0, n_panels * LANES - n), (0, 0)))
    high = None
    if bits == 5:
        high, v = v >> 4, v & np.uint8(15)
    groups: npt.NDArray[Any]
    if bits <= 5 and il == 2:  # two words per row: nibble q of word e is k0 + 2q + e
        w = v.reshape(n_panels, LANES, k // 8, 4, 2).astype(np.uint16)
        words = w[:, :, :, 0] | w[:, :, :, 1] << 4 | w[:, :, :, 2] << 8 | w[:, :, :, 3] << 12
        groups = words.view(np.uint8).reshape(n_panels, LANES, k // 8, 4)
    elif bits <= 5:
        g = v.reshape(n_panels, LANES, k // (2 * il), 2, il)
        groups = g[:, :, :, 0, :] | (g[:, :, :, 1, :] << np.uint8(4))
    else:
        groups = (v + np.uint8(add)).reshape(n_panels, LANES, k // il, il)
    lanes = np.ascontiguousarray(groups.transpose(0, 2, 1, 3)).reshape(n_panels, -1)
    hb = np.zeros((n_panels, 0), np.uint8)
    if high is not None:
        parts = (4, 2) if il == 2 else (2, 4)
        h = high.reshape(n_panels, LANES, k // 8, *parts).transpose(0, 2, 3, 1, 4)
        hb = np.packbits(h.reshape(n_panels, -1, 8), axis=-1, bitorder="little")
        hb = np.ascontiguousarray(hb.reshape(n_panels, -1))
    return lanes, hb


@pytest.mark.parametrize("rows", [16, 37, 1])  # whole panels, a part panel, one row
@pytest.mark.parametrize(("bits", "il", "add"), [
    (4, 2, 0), (4, 4, 0), (5, 2, 0), (5, 4, 0), (8, 2, 128), (8, 2, 0), (8, 4, 0),
])  # fmt: skip
def test_one_pass_packing_gives_the_numpy_bytes(rows: int, bits: int, il: int, add: int) -> None:
    rng = np.random.default_rng(rows * 100 + bits * 10 + il)
    v = rng.integers(0, 2**bits, (rows, 96), dtype=np.uint8)  # 96: three groups of 32
    n_panels = -(-rows // LANES)
    lanes, hb = numpy_pack(v, il, bits, add)
    if bits <= 5:
        got, got_hb = pack_four_bit(v, n_panels, il, bits == 5)
        np.testing.assert_array_equal(got_hb, hb)
    else:
        got = pack_eight_bit(v, n_panels, il, add)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, lanes)

"""GGUF block formats decoded into the one integer form the panel kernels use.

Each quantized type's rows become small unsigned integers `v` (N, K) with a per-type offset,
per super-block fp16 scale d (and minimum dm), and per sub-block integer scale isc (and
minimum imn), such that weight = (d * isc) * (v - off) + dm * imn, which is how
gguf.quants.dequantize computes every one of them (K-quants subtract dmin * m: dm holds
-dmin, exactly). Layouts are llama.cpp's ggml-common.h block structs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from enginecore.kernels.pack import QK_K, k_nibble_values, q6_k_values
from enginecore.weights import Decoded

Q = gguf.GGMLQuantizationType
U8 = npt.NDArray[Any]  # uint8 blocks and values
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])


def _f16(raw: U8) -> npt.NDArray[np.uint16]:
    return np.ascontiguousarray(raw).view(np.uint16)[..., 0]


def _neg_f16(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.uint16]:
    return bits ^ np.uint16(0x8000)


def _nibbles(qs: U8) -> U8:
    """(..., 16) bytes -> (..., 32): low nibbles are elements 0..15, high ones 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _bits(raw: U8, n: int) -> U8:
    """(..., n // 8) bytes -> (..., n) bits, little-endian within each byte."""
    return np.unpackbits(raw, axis=-1, bitorder="little")[..., :n]


def _rows(blocks: U8) -> tuple[int, int]:
    return blocks.shape[0], blocks.shape[1]


def _legacy(
    blocks: U8, v: U8, off: int, minimum: bool, bits: int
) -> Decoded:  # 32-value blocks, fp16 d (and m) first
    n, nb = _rows(blocks)
    d = _f16(blocks[:, :, 0:2])
    dm = _f16(blocks[:, :, 2:4]) if minimum else None
    return Decoded(v.reshape(n, nb * 32), off, 32, 1, bits, d, dm, None, None)


def q4_0(b: U8) -> Decoded:
    return _legacy(b, _nibbles(b[:, :, 2:18]), 8, False, 4)


def q4_1(b: U8) -> Decoded:
    return _legacy(b, _nibbles(b[:, :, 4:20]), 0, True, 4)


def q5_0(b: U8) -> Decoded:
    return _legacy(b, _nibbles(b[:, :, 6:22]) | (_bits(b[:, :, 2:6], 32) << 4), 16, False, 5)


def q5_1(b: U8) -> Decoded:
    return _legacy(b, _nibbles(b[:, :, 8:24]) | (_bits(b[:, :, 4:8], 32) << 4), 0, True, 5)


def q8_0(b: U8) -> Decoded:
    v = (b[:, :, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return _legacy(b, v, 128, False, 8)


def iq4_nl(b: U8) -> Decoded:
    v = (IQ4_VALUES[_nibbles(b[:, :, 2:18])] + 128).astype(np.uint8)
    return _legacy(b, v, 128, False, 8)


def _k_scales_mins(s: U8) -> tuple[U8, U8]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit minimums."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 2) & 48)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 2) & 48)], axis=-1)
    return sc, mn


def _k(
    v: U8, off: int, sub: int, bits: int, d: U8, isc: U8,
    dmin: U8 | None = None, imn: U8 | None = None,
) -> Decoded:  # fmt: skip
    n = v.shape[0]
    return Decoded(
        np.ascontiguousarray(v.reshape(n, -1)), off, sub, QK_K // sub, bits, _f16(d),
        None if dmin is None else _neg_f16(_f16(dmin)),
        isc.reshape(n, -1).astype(np.int8),
        None if imn is None else imn.reshape(n, -1).astype(np.int8),
    )  # fmt: skip


def q2_k(b: U8) -> Decoded:
    n, nb = _rows(b)
    scales, qs = b[:, :, 0:16], b[:, :, 16:80].reshape(n, nb, 2, 1, 32)
    v = (qs >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3  # (n, nb, 2, 4, 32)
    return _k(v, 0, 16, 4, b[:, :, 80:82], scales & 15, b[:, :, 82:84], scales >> 4)


def q3_k(b: U8) -> Decoded:
    n, nb = _rows(b)
    hmask, qs, s = b[:, :, 0:32], b[:, :, 32:96].reshape(n, nb, 2, 1, 32), b[:, :, 96:108]
    low = ((qs >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3).reshape(n, nb, 8, 32)
    high = (hmask[:, :, None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    lsc = np.concatenate([s[..., 0:8] & 15, s[..., 0:8] >> 4], axis=-1)
    hsc = (s[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3  # (n, nb, 4 bytes, 4)
    sc = lsc | (hsc.swapaxes(-1, -2).reshape(n, nb, 16) << 4)
    return _k(low | (high << 2), 4, 16, 4, b[:, :, 108:110], sc.astype(np.int16) - 32)


def q4_k(b: U8) -> Decoded:
    sc, mn = _k_scales_mins(b[:, :, 4:16])
    return _k(k_nibble_values(b, 16, -1), 0, 32, 4, b[:, :, 0:2], sc, b[:, :, 2:4], mn)


def q5_k(b: U8) -> Decoded:
    sc, mn = _k_scales_mins(b[:, :, 4:16])
    return _k(k_nibble_values(b, 48, 16), 0, 32, 5, b[:, :, 0:2], sc, b[:, :, 2:4], mn)


def q6_k(b: U8) -> Decoded:
    scales = b[:, :, 192:208].view(np.int8)
    return _k(q6_k_values(b), 32, 16, 8, b[:, :, 208:210], scales)


def iq4_xs(b: U8) -> Decoded:
    n, nb = _rows(b)
    sh = b[:, :, 2:4].copy().view(np.uint16)  # (n, nb, 1)
    sl = b[:, :, 4:8]
    low = np.stack([sl & 15, sl >> 4], axis=-1).reshape(n, nb, 8)
    high = (sh >> (2 * np.arange(8, dtype=np.uint16))) & 3
    ls = low.astype(np.int16) | (high.astype(np.int16) << 4)
    qs = b[:, :, 8:136].reshape(n, nb, 8, 16)
    v = (IQ4_VALUES[np.concatenate([qs & 15, qs >> 4], axis=-1)] + 128).astype(np.uint8)
    return _k(v, 128, 32, 8, b[:, :, 0:2], ls - 32)


DECODERS: dict[Q, Callable[[U8], Decoded]] = {
    Q.Q4_0: q4_0, Q.Q4_1: q4_1, Q.Q5_0: q5_0, Q.Q5_1: q5_1, Q.Q8_0: q8_0, Q.IQ4_NL: iq4_nl,
    Q.Q2_K: q2_k, Q.Q3_K: q3_k, Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k, Q.IQ4_XS: iq4_xs,
}  # fmt: skip
DENSE = (Q.F32, Q.F16, Q.BF16)
SERVED = ", ".join(t.name for t in (*DENSE, *DECODERS))


def decode(qtype: Q, raw: U8) -> Decoded:
    """raw (N, row bytes) of a quantized type -> its integer form."""
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, type_size)
    return DECODERS[qtype](blocks)


def dequantize(dec: Decoded) -> npt.NDArray[np.float32]:
    """The fp32 weights (N, K) a Decoded stands for, in gguf.quants.dequantize's arithmetic."""
    n, k = dec.v.shape
    per_super = dec.sub * dec.sps
    d = dec.d.view(np.float16).astype(np.float32)
    sc = np.repeat(d, dec.sps, axis=1)
    if dec.isc is not None:
        sc = sc * dec.isc.astype(np.float32)
    w = np.repeat(sc, dec.sub, axis=1) * (dec.v.astype(np.float32) - np.float32(dec.off))
    if dec.dm is not None:
        mn = np.repeat(dec.dm.view(np.float16).astype(np.float32), dec.sps, axis=1)
        if dec.imn is not None:
            mn = mn * dec.imn.astype(np.float32)
        w = w + np.repeat(mn, dec.sub, axis=1)
    assert w.shape == (n, k) and per_super * dec.d.shape[1] == k
    return w.astype(np.float32)

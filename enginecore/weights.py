"""The canonical in-memory weights, whatever file they came from, and how a matrix is applied."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from enginecore.kernels import gemm, ops, quant

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

# Up to this many activation rows, a quantized matrix is applied by the numba kernel that
# streams its packed bytes (memory-bound decode); above it, by BLAS on the dense fp32 copy.
QUANT_KERNEL_MAX_ROWS = 8


class WeightKind(IntEnum):
    F32 = 0
    Q8_0 = 1
    Q4_1 = 2


@dataclass(slots=True)
class Matrix:
    """One weight matrix (out_features, in_features); rows are output features."""

    kind: WeightKind
    shape: tuple[int, int]
    dense: F32  # (N, K) float32, exact dequantization; used by BLAS and for lookups
    qs: npt.NDArray[Any] | None = None  # Q4_1 uint8 (N, K // 2); Q8_0 int8 (N, K)
    d: npt.NDArray[Any] | None = None  # (N, K // 32) float32 block scales
    m: npt.NDArray[Any] | None = None  # (N, K // 32) float32 Q4_1 block minimums

    @staticmethod
    def f32(w: npt.NDArray[np.floating]) -> Matrix:
        dense = np.ascontiguousarray(w, dtype=np.float32)
        assert dense.ndim == 2
        return Matrix(WeightKind.F32, (dense.shape[0], dense.shape[1]), dense)

    @staticmethod
    def q8_0(qs: npt.NDArray[np.int8], d: F32) -> Matrix:
        dense = np.empty(qs.shape, dtype=np.float32)
        quant.dequantize_q8_0(qs, d, dense)
        return Matrix(WeightKind.Q8_0, (qs.shape[0], qs.shape[1]), dense, qs, d)

    @staticmethod
    def q4_1(qs: npt.NDArray[np.uint8], d: F32, m: F32) -> Matrix:
        dense = np.empty((qs.shape[0], qs.shape[1] * 2), dtype=np.float32)
        quant.dequantize_q4_1(qs, d, m, dense)
        return Matrix(WeightKind.Q4_1, (dense.shape[0], dense.shape[1]), dense, qs, d, m)

    def take_rows(self, rows: npt.NDArray[np.intp]) -> Matrix:
        """The same matrix restricted to (reordered) output rows; exact for every kind."""
        qs, d, m = (
            None if a is None else np.ascontiguousarray(a[rows]) for a in (self.qs, self.d, self.m)
        )
        dense = np.ascontiguousarray(self.dense[rows])
        return Matrix(self.kind, (dense.shape[0], self.shape[1]), dense, qs, d, m)

    def matmul(self, x: F32, out: F32) -> None:
        """out (n, N) = x (n, K) @ W.T."""
        n = x.shape[0]
        if self.kind == WeightKind.Q4_1 and n <= QUANT_KERNEL_MAX_ROWS:
            xsum = np.empty((n, self.shape[1] // 32), dtype=np.float32)
            quant.block_sums(x, xsum)
            quant.q4_1_matmul(x, xsum, self.qs, self.d, self.m, out)
        elif self.kind == WeightKind.Q8_0 and n <= QUANT_KERNEL_MAX_ROWS:
            quant.q8_0_matmul(x, self.qs, self.d, out)
        else:
            gemm.matmul_nt(x, self.dense, out)

    def gather(self, ids: I32, out: F32) -> None:
        """out (n, K) = rows `ids` of W (an embedding lookup)."""
        ops.gather_rows_f32(ids, self.dense, out)


def _take(a: npt.NDArray[Any] | None, rows: npt.NDArray[np.intp]) -> npt.NDArray[Any] | None:
    return None if a is None else np.ascontiguousarray(a[rows])


def concat_rows(parts: list[Matrix]) -> Matrix:
    """Stack matrices of one kind along the output dimension (fused qkv, gate_up)."""
    kind = parts[0].kind
    assert all(p.kind == kind and p.shape[1] == parts[0].shape[1] for p in parts)
    qs, d, m = (
        None
        if getattr(parts[0], name) is None
        else np.concatenate([getattr(p, name) for p in parts])
        for name in ("qs", "d", "m")
    )
    dense = np.concatenate([p.dense for p in parts])
    return Matrix(kind, (dense.shape[0], parts[0].shape[1]), dense, qs, d, m)


@dataclass(slots=True)
class LayerWeights:
    attn_norm: F32  # (d,)
    wqkv: Matrix  # (q_dim + 2 * kv_dim, d), q and k rows in HF (rotate-half) order
    wo: Matrix  # (d, q_dim)
    ffn_norm: F32  # (d,)
    w_gate_up: Matrix  # (2 * ffn, d) = [gate; up]
    w_down: Matrix  # (d, ffn)


@dataclass(slots=True)
class Weights:
    embed: Matrix  # (vocab, d)
    layers: list[LayerWeights]
    final_norm: F32  # (d,)
    lm_head: Matrix  # (vocab, d); the embedding itself when tied

"""The canonical in-memory weights, whatever file they came from, and how a matrix is applied.

A matrix's type chooses its kernels: `DenseMatrix` (F32, F16 and BF16 files, Hugging Face
checkpoints) keeps fp32 panels of 32 rows for a batch-invariant kernel (kernels/dense.py);
`PackedMatrix` (every quantized GGUF type) keeps its integer form in 16-row panels and
multiplies by the panel kernels of its `Numerics` (kernels/panels.py), never through a dense
fp32 copy; `FusedMatrix` stacks parts of different types along the output dimension (fused
q/k/v or gate/up of a mixed file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from enginecore.kernels import dense, dequant, dot, gemm, panels, threads
from enginecore.kernels.pack import pack_eight_bit, pack_four_bit

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

# Exact mode: up to this many activation rows a packed matrix is streamed by the lane kernel;
# above it, cache-sized tiles are dequantized for sgemm.
EXACT_STREAM_MAX_ROWS = 8

# The integer dot-product path of this process: an Isa (tests may set another the host
# supports), or an int, which runs the same path from kernels compiled with every path
# (the tests that loop over the paths: one compilation instead of one per path).
ISA: dot.Isa | int = dot.SELECTED


def isa_arg() -> dot.Path | int:
    """The kernels' `isa` argument for ISA (kernels/dot.py's Path): an Isa as a dot.Path, so
    that each kernel is compiled with that path alone."""
    return dot.path(ISA) if isinstance(ISA, dot.Isa) else ISA


class Decoded(NamedTuple):
    """One quantized matrix in integer form; rows are output features."""

    v: npt.NDArray[np.uint8]  # (N, K) values, each below 2 ** bits
    off: int  # weight = sc * (v - off) + mn
    sub: int  # sub-block length along K (16 or 32)
    sps: int  # sub-blocks per super-block (1: the scale is per sub-block, isc = 1)
    bits: int  # 4, 5 (32 for sub) or 8: the width the panels keep each value in
    d: npt.NDArray[np.uint16]  # (N, K // (sub * sps)) fp16 bits
    dm: npt.NDArray[np.uint16] | None  # (N, K // (sub * sps)) fp16 bits, None: no minimum
    isc: npt.NDArray[np.int8] | None  # (N, K // sub), None when sps == 1
    imn: npt.NDArray[np.int8] | None  # (N, K // sub), None when sps == 1 or no minimum


class Numerics(StrEnum):
    """How activations meet quantized weights."""

    EXACT = "exact"  # fp32 activations: reproduces an fp32 reference on the same weights
    INT8 = "int8"  # activations quantized per 16 to int8 (llama.cpp: per 32), int32 sums
    INT16 = "int16"  # per 32 to int16: ~250x smaller rounding error than int8, int32 sums

    @property
    def batch_invariant(self) -> bool:
        """Every output element is computed in one order whatever the batch around it."""
        return self != Numerics.EXACT


class Activations(NamedTuple):
    """A matmul input quantized once, shared by every part of a fused matrix."""

    xq: npt.NDArray[Any]  # (n, K) int8 or int16
    xa: F32  # (K // block, n) block scales (panels.act_block: 16 for int8, 32 for int16)
    xb: F32  # (K // 16 + K // 32, n) sums of the dequantized values per 16, then per 32


# integer mode -> (a zero-size array of its activations' type, their largest magnitude)
ACTIVATIONS: dict[Numerics, tuple[npt.NDArray[Any], int]] = {
    Numerics.INT8: (np.empty(0, np.int8), 127),
    Numerics.INT16: (np.empty(0, np.int16), 32767),
}


def quantize(x: F32, numerics: Numerics) -> Activations:
    kind, qmax = ACTIVATIONS[numerics]
    return Activations(*panels.quantize(x, kind, qmax, threads.count()))


@dataclass(slots=True)
class DenseMatrix:
    """An fp32 matrix in transposed panels of output rows (kernels/dense.py): every output
    element one fma chain in a fixed order, whatever the batch."""

    panels: F32  # (ceil(N / dense.PANEL), K, dense.PANEL)
    n: int  # output features

    @classmethod
    def pack(cls, w: F32) -> DenseMatrix:
        """From (out_features, in_features) rows."""
        n = int(w.shape[0])
        return cls(_panel_major(np.asarray(w, np.float32), -(-n // dense.PANEL), dense.PANEL), n)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.panels.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.panels.nbytes)

    def rows(self) -> F32:
        """The (N, K) matrix (a copy: tests and benchmarks)."""
        p, k, width = self.panels.shape
        return np.ascontiguousarray(self.panels.transpose(0, 2, 1).reshape(p * width, k)[: self.n])

    def matmul(self, x: F32, out: F32, col0: int = 0, acts: Activations | None = None) -> None:
        """out[:, col0 : col0 + N] = x (n, K) @ W.T; out C-contiguous."""
        assert out.flags.c_contiguous and out.shape[1] >= col0 + self.n
        x = np.ascontiguousarray(x, np.float32)
        dense.matmul(x, self.panels, self.n, out, col0, threads.count())

    def gather(self, ids: I32, out: F32) -> None:
        """out (n, K) = rows `ids` of W (an embedding lookup)."""
        dense.gather(ids, self.panels, out)

    def panel_parts(self) -> None:
        return None  # the dense kernel, not the integer panel kernels


def five_as_eight_here(dec: Decoded, numerics: Numerics) -> bool:
    """Whether this process packs `dec` as 8-bit values: Q5_0 (5 bits, offset 16, no minimum)
    under int16 activations on the AVX2 path. There, without mask registers, adding each
    value's fifth bit costs a broadcast, an and, a compare, an and and an add per 16 lanes
    (kernels/dot.py's with_high), more than the multiply-adds it feeds; 8-bit panels hold
    v - 16 in an int8 (one sign-extension per 16 weights) for 8.5 bits a weight instead of
    5.5. The sums are the same exact integers of v - 16 and the float steps after them the
    same (kernels/simd.py: both fold the offset), so the bits do not change."""
    five = dec.bits == 5 and dec.dm is None
    return five and numerics == Numerics.INT16 and ISA == dot.Isa.AVX2


def _panel_major(a: npt.NDArray[Any], n_panels: int, width: int = panels.LANES) -> npt.NDArray[Any]:
    """(N, m) per-row values -> (P, m, width), zero rows padding the last panel."""
    pad = n_panels * width - a.shape[0]
    a = np.pad(a, ((0, pad), (0, 0)))
    return np.ascontiguousarray(a.reshape(n_panels, width, -1).transpose(0, 2, 1))


@dataclass(slots=True)
class PackedMatrix:
    """A quantized matrix in 16-row panels (layout: kernels/dot.py, kernels/panels.py)."""

    qtype: str  # the GGUF type it came from
    numerics: Numerics
    shape: tuple[int, int]
    four_bit: bool  # lanes hold nibbles (4- and 5-bit values)
    off: int
    sub: int
    sps: int
    has_min: bool
    lanes: npt.NDArray[Any]  # (P, K * 16 / lane bytes [/ 2 when four_bit]) uint32 / uint16
    hb: npt.NDArray[np.uint8]  # (P, K * 2) 5-bit values' high bits, (P, 0) for other widths
    d: npt.NDArray[np.uint16]  # (P, n_super, 16)
    dm: npt.NDArray[np.uint16]  # (P, n_super or 0, 16)
    isc: npt.NDArray[np.int8]  # (P, n_sub or 0, 16)
    imn: npt.NDArray[np.int8]  # (P, n_sub or 0, 16)

    @staticmethod
    def pack(
        qtype: str, dec: Decoded, numerics: Numerics, five_as_eight: bool | None = None
    ) -> PackedMatrix:
        """`five_as_eight`: 5-bit values without a minimum (Q5_0) in 8-bit panels under int16
        activations; by default where the process's path is AVX2 (five_as_eight_here)."""
        il = 2 if numerics == Numerics.INT16 else 4  # bytes per row and group
        n, k = dec.v.shape
        n_panels = -(-n // panels.LANES)
        if five_as_eight is None:
            five_as_eight = five_as_eight_here(dec, numerics)
        four_bit = dec.bits <= 5 and not five_as_eight
        if four_bit:  # 5-bit: nibbles in the lanes, the fifth bits apart (kernels/pack.py)
            lanes, hb = pack_four_bit(dec.v, n_panels, il, dec.bits == 5)
        else:
            add = 0
            if il == 2:  # int16 activations: v - off as int8 (kernels/dot.py)
                lo, hi = int(dec.v.min()), int(dec.v.max())
                if dec.dm is not None or lo < dec.off - 128 or hi > dec.off + 127:
                    raise ValueError(f"{qtype}: no int16 panel for 8-bit values with a "
                                     "minimum or outside off - 128 .. off + 127")  # fmt: skip
                add = -dec.off % 256  # v - off modulo 256: its int8 bytes
            lanes = pack_eight_bit(dec.v, n_panels, il, add)
            hb = np.zeros((n_panels, 0), np.uint8)
        lanes = lanes.view(np.uint16 if il == 2 else np.uint32)

        def per_row(a: npt.NDArray[Any] | None, dtype: type) -> npt.NDArray[Any]:
            if a is None:
                return np.zeros((n_panels, 0, panels.LANES), dtype)
            return _panel_major(a, n_panels)

        return PackedMatrix(
            qtype, numerics, (n, k), four_bit, dec.off, dec.sub, dec.sps, dec.dm is not None,
            lanes, hb, per_row(dec.d, np.uint16), per_row(dec.dm, np.uint16),
            per_row(dec.isc, np.int8), per_row(dec.imn, np.int8),
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        arrays = (self.lanes, self.hb, self.d, self.dm, self.isc, self.imn)
        return sum(int(a.nbytes) for a in arrays)

    def _format(self) -> tuple[Any, ...]:
        # the per-panel arrays first (panel_slice relies on it), then the type's constants
        return (self.lanes, self.hb, self.d, self.dm, self.isc, self.imn, self.four_bit,
                self.off, self.sub, self.sps, self.has_min)  # fmt: skip

    def matmul(self, x: F32, out: F32, col0: int = 0, acts: Activations | None = None) -> None:
        """out[:, col0 : col0 + N] = x (n, K) @ W.T."""
        n_rows, parts = self.shape[0], threads.count()
        if self.numerics != Numerics.EXACT and acts is not None:
            panels.int_matmul(acts.xq, acts.xa, acts.xb, self._format(), isa_arg(), out, col0,
                              n_rows, parts)  # fmt: skip
        elif self.numerics != Numerics.EXACT:
            kind, qmax = ACTIVATIONS[self.numerics]
            panels.quantize_matmul(
                x, kind, qmax, self._format(), isa_arg(), out, col0, n_rows, parts
            )
        elif x.shape[0] > EXACT_STREAM_MAX_ROWS and gemm.AVAILABLE:
            dequant.f32_gemm(x, self._format(), out, col0, n_rows, parts)
        else:
            xs = np.empty((x.shape[0], self.shape[1] // self.sub), np.float32)
            dequant.block_sums(x, self.sub, xs)
            dequant.f32_matmul(x, xs, self._format(), out, col0, n_rows, parts)

    def gather(self, ids: I32, out: F32) -> None:
        """out (n, K) = rows `ids` of W, dequantized (an embedding lookup)."""
        dequant.dequantize_rows(ids, self._format(), out)

    def panel_parts(self) -> tuple[tuple[Any, int], ...] | None:
        """((format, rows),) for kernels/layer.py; None in exact mode."""
        return None if self.numerics == Numerics.EXACT else ((self._format(), self.shape[0]),)


def panel_slice(fmt: tuple[Any, ...], p0: int, p1: int) -> tuple[Any, ...]:
    """Panels p0..p1-1 of a panel format (PackedMatrix._format): views of its six per-panel
    arrays, the same constants."""
    return tuple(a[p0:p1] for a in fmt[:6]) + fmt[6:]


@dataclass(slots=True)
class FusedMatrix:
    """Matrices of different types stacked along the output dimension."""

    parts: list[DenseMatrix | PackedMatrix]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: F32, out: F32, col0: int = 0, acts: Activations | None = None) -> None:
        integer = [p.numerics for p in self.parts if isinstance(p, PackedMatrix)]
        if acts is None and integer and integer[0] != Numerics.EXACT:
            acts = quantize(x, integer[0])  # every part sees the same quantized input
        for p in self.parts:
            p.matmul(x, out, col0, acts)
            col0 += p.shape[0]

    def gather(self, ids: I32, out: F32) -> None:
        raise AssertionError("an embedding is never fused")

    def panel_parts(self) -> tuple[tuple[Any, int], ...] | None:
        """Every part's (format, rows), or None when a part is dense or in exact mode."""
        parts = [p.panel_parts() for p in self.parts]
        return None if None in parts else tuple(x for p in parts if p for x in p)


Matrix = DenseMatrix | PackedMatrix | FusedMatrix


Part = F32 | tuple[str, Decoded]  # a matrix's rows: dense, or (GGUF type, integer form)


def fuse(parts: Sequence[Part], numerics: Numerics) -> Matrix:
    """One matrix from row blocks: dense arrays, or (GGUF type, integer form) pairs.

    Parts of one quantized type are concatenated before packing (one kernel call); mixed
    types stay separate parts."""
    runs: list[list[Part]] = []
    for p in parts:
        if runs and _same_kind(runs[-1][-1], p):
            runs[-1].append(p)
        else:
            runs.append([p])
    built = [_build(run, numerics) for run in runs]
    return built[0] if len(built) == 1 else FusedMatrix(built)


def _same_kind(a: Part, b: Part) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0]
    return not isinstance(a, tuple) and not isinstance(b, tuple)


def _build(run: list[Part], numerics: Numerics) -> DenseMatrix | PackedMatrix:
    rows = [p for p in run if not isinstance(p, tuple)]
    if rows:
        return DenseMatrix.pack(np.concatenate(rows))
    coded = [p for p in run if isinstance(p, tuple)]
    decs = [dec for _, dec in coded]
    first = decs[0]

    def cat(name: str) -> Any:
        values = [getattr(dec, name) for dec in decs]
        return None if values[0] is None else np.concatenate(values)

    dec = first._replace(v=cat("v"), d=cat("d"), dm=cat("dm"), isc=cat("isc"), imn=cat("imn"))
    return PackedMatrix.pack(coded[0][0], dec, numerics)


@dataclass(slots=True)
class LayerWeights:
    """Norm weights are the multipliers themselves (Gemma's (1 + w) already added)."""

    attn_norm: F32  # (d,)
    wqkv: Matrix  # (q_dim + 2 * kv_dim, d), q and k rows in HF (rotate-half) order
    wo: Matrix  # (d, q_dim)
    ffn_norm: F32  # (d,)
    w_gate_up: Matrix  # (2 * ffn, d) = [gate; up]
    w_down: Matrix  # (d, ffn)
    qkv_bias: F32 | None = None  # (q_dim + 2 * kv_dim,)
    q_norm: F32 | None = None  # (head_dim,): each query head normed before RoPE
    k_norm: F32 | None = None  # (head_dim,)
    post_attn_norm: F32 | None = None  # (d,): the attention output normed before the residual
    post_ffn_norm: F32 | None = None  # (d,): the MLP output normed before the residual

    @property
    def plain(self) -> bool:
        """A Llama layer: no biases, no q/k or post norms (what the fused integer layer runs)."""
        extras = (self.qkv_bias, self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm)
        return all(e is None for e in extras)


@dataclass(slots=True)
class Weights:
    embed: DenseMatrix | PackedMatrix  # (vocab, d)
    layers: list[LayerWeights]
    final_norm: F32  # (d,)
    lm_head: DenseMatrix | PackedMatrix  # (vocab, d); the embedding itself when tied
    numerics: Numerics
    _panel_layers: list[tuple[Any, ...]] | None = field(default=None, init=False, repr=False)

    def panel_layers(self) -> list[tuple[Any, ...]] | None:
        """Per layer (wqkv, wo, w_gate_up, w_down) as panel parts (kernels/layer.py), or
        None when some matrix is not run by the integer panel kernels."""
        if self._panel_layers is None and self.numerics != Numerics.EXACT:
            mats = [
                tuple(m.panel_parts() for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down))
                for lw in self.layers
            ]
            if all(p is not None for layer in mats for p in layer):
                self._panel_layers = mats
        return self._panel_layers

    def layer_matrices(self) -> list[Matrix]:
        """Every layer's wqkv, wo, w_gate_up and w_down, layer by layer."""
        return [m for lw in self.layers for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)]

    @property
    def nbytes(self) -> int:
        mats = self.layer_matrices()
        mats += [self.embed] if self.lm_head is self.embed else [self.embed, self.lm_head]
        return sum(m.nbytes for m in mats)

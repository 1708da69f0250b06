"""Attention's two inner products as LLVM vector code, called from numba (kernels/attention.py).

numba's loops reduce q.k over head_dim with a horizontal sum per score and keep no
accumulator in a register across positions; these intrinsics keep them all in registers:

- `qk_tile`: scores of up to QK_HEADS query heads (one kv head's group) for 16 or 32
  positions of a K block stored transposed, (head_dim, block_size) per kv head, so that a
  vector of 16 lanes is 16 positions: s[g, p] = fma chain over i = 0 .. head_dim - 1 of
  q[g, i] * k[i, p], one lane per position, no reduction across lanes.
- `pv_tile`: acc[g, d] += w[g, p] * v[p, d] for up to PV_HEADS heads and 16 * nv dims, an
  fma chain over positions in order, one lane per dim.

Each output element is one fused multiply-add chain in a fixed order, whatever the tile
shape, the ISA or the batch, so `qk_scalar` / `pv_scalar` (plain numba loops of the same
fmas) give the same bits: they serve block sizes below 16 and head dims that are not a
multiple of 16, and are the tests' oracle. K and V elements are float32 or fp16 bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from enginecore.kernels.dot import as_i64, host_features, prefetch_line
from enginecore.kernels.f16 import kv_load
from enginecore.kernels.simd import f16x16, fma, fma32, splat_f

F32, I64 = ir.FloatType(), ir.IntType(64)
V16 = ir.VectorType(F32, 16)
LANES = 16

# Tile shapes (they change speed, never bits): with 32 vector registers (AVX-512) a qk tile
# holds 4 heads x 2 vectors of scores and a pv tile 4 heads x 4 vectors of 16 dims; with 16
# (AVX2, where a 16-lane vector is two registers) 2 heads x 2 vectors, or 3 heads x 1 (6 ymm of
# sums): a kv head's group of 3 query heads (SmolLM2's) then reads and widens its keys and
# values once, where tiles of 2 + 1 heads did twice (`tile_vecs`).
_WIDE = "avx512f" in host_features()
QK_HEADS = 4 if _WIDE else 3
PV_HEADS, PV_VECS = (4, 4) if _WIDE else (3, 2)
TWO_VEC_HEADS = 4 if _WIDE else 2  # the most heads (rows) of a tile of two vectors
# Blocks of 16 positions a q.k tile takes at once (qk_blocks): within one block a tile of a
# kv head's 3 query heads had 3 fma chains, each waiting out the fma's latency (4 cycles) at
# every step, where 2 ports want 8 chains in flight
QK_BLOCKS = 4 if _WIDE else 2


@njit(cache=True, nogil=True, inline="always")
def tile_vecs(heads, most):
    # the 16-lane vectors a tile of `heads` heads takes at most (`most` the kind's own limit)
    return most if heads <= TWO_VEC_HEADS else 1


def _load16(b: ir.IRBuilder, p: ir.Value, f16: bool) -> ir.Value:
    """16 consecutive KV elements (float32, or fp16 bits widened) at p as a float32 vector."""
    return f16x16(b, p) if f16 else b.load(b.bitcast(p, V16.as_pointer()), align=4)


def _ptr(
    context: Any, b: ir.IRBuilder, ty: types.Array, value: ir.Value, off: ir.Value
) -> ir.Value:
    """Pointer to flat element `off` of a C-contiguous array."""
    data = context.make_array(ty)(context, b, value).data
    return b.gep(data, [off])


def _emit_tile(
    b: ir.IRBuilder,
    f16: bool,
    accumulate: bool,
    heads: int,
    nv: int,
    r: dict[str, ir.Value],
    bases: list[ir.Value] | None = None,
    ahead: list[ir.Value] | None = None,
) -> None:
    # o[g o_stride + 16 c + lane] (= 0, or its value when `accumulate`) + the fma chain over
    # i < n of x[g x_stride + i] * kv[i kv_stride + 16 c + lane], for g < heads, c < nv
    # (with `bases`, vector c's elements at bases[c][i kv_stride + lane] instead).
    # With a prefetch offset (pf_off >= 0), each step also asks for the same row's lines at
    # kv[pf_off + i kv_stride:] (with `ahead`, one line at ahead[c][i kv_stride] per vector):
    # the next block's, whose addresses the hardware cannot guess (a block table is a list of
    # scattered blocks)
    elem = 2 if f16 else 4
    lines = range(0, max(LANES * nv * elem // 64, 1) * 64 // elem, 64 // elem)

    def out(g: int, c: int) -> ir.Value:
        at = b.add(b.mul(ir.Constant(I64, g), r["o_stride"]), ir.Constant(I64, LANES * c))
        return b.bitcast(b.gep(r["o"], [at]), V16.as_pointer())

    def start(g: int, c: int) -> ir.Value:
        return b.load(out(g, c), align=4) if accumulate else ir.Constant(V16, None)

    accs = [
        [cgutils.alloca_once_value(b, start(g, c)) for c in range(nv)]  # type: ignore[no-untyped-call]
        for g in range(heads)
    ]
    with cgutils.for_range(b, r["n"]) as loop:
        i = loop.index
        step = b.mul(i, r["kv_stride"])
        row = b.gep(r["kv"], [step])
        kvs = [
            _load16(b, b.gep(row, [ir.Constant(I64, LANES * c)]), f16)
            if bases is None
            else _load16(b, b.gep(bases[c], [step]), f16)
            for c in range(nv)
        ]
        with b.if_then(r["prefetch"], likely=True):
            if ahead is not None:  # a row of each vector's next block: one line
                for p in ahead:
                    prefetch_line(b, b.gep(p, [step]))
            else:
                nxt = b.gep(r["pf"], [step])
                for line in lines:
                    prefetch_line(b, b.gep(nxt, [ir.Constant(I64, line)]))
        for g in range(heads):
            at = b.add(b.mul(ir.Constant(I64, g), r["x_stride"]), i)
            xv = splat_f(b, b.load(b.gep(r["x"], [at])))
            for c in range(nv):
                b.store(fma(b, xv, kvs[c], b.load(accs[g][c])), accs[g][c])
    for g in range(heads):
        for c in range(nv):
            b.store(b.load(accs[g][c]), out(g, c), align=4)


def _tile(kind: str, max_heads: int, max_vecs: int) -> Any:
    # kind "qk": (q, q_off, q_stride, k, k_off, k_stride, n, s, s_off, s_stride, heads, nv)
    # kind "pv": (w, w_off, w_stride, v, v_off, v_stride, n, a, a_off, a_stride, heads, nv)
    # kind "qkb": "qk" with k_off an int64 array, vector c's keys from element k_off[c] on
    names = ("x", "x_off", "x_stride", "kv", "kv_off", "kv_stride", "n", "o", "o_off",
             "o_stride", "heads", "nv", "pf_off")  # fmt: skip

    def typer(typingctx: Any, x: Any, x_off: Any, x_stride: Any, kv: Any, kv_off: Any,
              kv_stride: Any, n: Any, o: Any, o_off: Any, o_stride: Any, heads: Any,
              nv: Any, pf_off: Any) -> Any:  # fmt: skip
        args = (x, x_off, x_stride, kv, kv_off, kv_stride, n, o, o_off, o_stride, heads, nv,
                pf_off)  # fmt: skip
        if not all(isinstance(a, types.Array) and a.layout == "C" for a in (x, kv, o)):
            return None
        per_vec = kind == "qkb"
        if per_vec != (isinstance(kv_off, types.Array) and kv_off.dtype == types.int64):
            return None
        if x.dtype != types.float32 or o.dtype != types.float32:
            return None
        if kv.dtype not in (types.float32, types.uint16):
            return None
        f16 = kv.dtype == types.uint16
        sig = types.void(*args)

        def codegen(context: Any, b: ir.IRBuilder, sig: Any, vals: Any) -> Any:
            v = dict(zip(names, vals, strict=True))
            ty = dict(zip(names, sig.args, strict=True))
            kv_at = ir.Constant(I64, 0) if per_vec else as_i64(b, v["kv_off"])
            r = {
                "x": _ptr(context, b, ty["x"], v["x"], as_i64(b, v["x_off"])),
                "kv": _ptr(context, b, ty["kv"], v["kv"], kv_at),
                "o": _ptr(context, b, ty["o"], v["o"], as_i64(b, v["o_off"])),
                **{k: as_i64(b, v[k]) for k in ("x_stride", "kv_stride", "n", "o_stride")},
            }
            pf_off = as_i64(b, v["pf_off"])
            r["prefetch"] = b.icmp_signed(">=", pf_off, ir.Constant(I64, 0))
            r["pf"] = _ptr(context, b, ty["kv"], v["kv"], pf_off)
            heads, nv = as_i64(b, v["heads"]), as_i64(b, v["nv"])
            if per_vec:  # k_offs[c], and k_offs[pf_off + c] to prefetch
                offs = _ptr(context, b, ty["kv_off"], v["kv_off"], ir.Constant(I64, 0))
                pf = b.select(r["prefetch"], pf_off, ir.Constant(I64, 0))

                def at(j: ir.Value) -> ir.Value:  # k's element k_offs[j]
                    return b.gep(r["kv"], [b.load(b.gep(offs, [j]))])

            for hh in range(1, max_heads + 1):
                for vv in range(1, max_vecs + 1):
                    hit = b.and_(
                        b.icmp_signed("==", heads, ir.Constant(I64, hh)),
                        b.icmp_signed("==", nv, ir.Constant(I64, vv)),
                    )
                    with b.if_then(hit):
                        bases = ahead = None
                        if per_vec:  # (the loads in the branch: k_offs may hold only nv)
                            bases = [at(ir.Constant(I64, c)) for c in range(vv)]
                            ahead = [at(b.add(pf, ir.Constant(I64, c))) for c in range(vv)]
                        _emit_tile(b, f16, kind == "pv", hh, vv, r, bases, ahead)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


# qk_tile(q, q_off, q_stride, k, k_off, k_stride, n, s, s_off, s_stride, heads, nv, pf_off):
# for g < heads (<= QK_HEADS) and p < 16 * nv (nv 1 or 2), flat elements of C-contiguous
# arrays: s[s_off + g s_stride + p] = sum over i < n, in order, of q[q_off + g q_stride + i]
# * k[k_off + i k_stride + p], as fmas. Any other heads / nv leave s untouched. pf_off >= 0:
# the same rows of k from element pf_off on are prefetched (never read).
qk_tile = _tile("qk", QK_HEADS, 2)
# qk_blocks(q, q_off, q_stride, k, k_offs, k_stride, n, s, s_off, s_stride, heads, nv, pf_off):
# qk_tile's scores with vector c's keys from flat element k_offs[c] of k on (k_offs int64),
# so that one tile takes nv blocks of 16 positions wherever the block table put them: for g <
# heads (<= QK_HEADS), c < nv (<= tile_vecs(heads, QK_BLOCKS)) and lane p < 16, s[s_off + g
# s_stride + 16 c + p] = the fma chain over i < n of q[q_off + g q_stride + i] * k[k_offs[c] +
# i k_stride + p]: the same chain, so the same bits, as qk_tile's. pf_off >= 0: each row's
# line at k[k_offs[pf_off + c] + i k_stride] is prefetched too (the blocks after these).
qk_blocks = _tile("qkb", QK_HEADS, QK_BLOCKS)
# pv_tile(w, w_off, w_stride, v, v_off, v_stride, n, a, a_off, a_stride, heads, nv, pf_off):
# for g < heads (<= PV_HEADS) and d < 16 * nv (nv <= PV_VECS): a[a_off + g a_stride + d] +=
# w[w_off + g w_stride + j] * v[v_off + j v_stride + d] for j = 0 .. n - 1 in order, as fmas;
# pf_off as qk_tile's.
pv_tile = _tile("pv", PV_HEADS, PV_VECS)


@njit(cache=True, nogil=True, inline="always")
def qk_scalar(q, q_off, q_stride, k, k_off, k_stride, n, s, s_off, s_stride, heads, width):
    # qk_tile's result for any `width` of positions, one element at a time
    for g in range(heads):
        for p in range(width):
            acc = np.float32(0.0)
            for i in range(n):
                acc = fma32(q[q_off + g * q_stride + i], kv_load(k[k_off + i * k_stride + p]), acc)
            s[s_off + g * s_stride + p] = acc


@njit(cache=True, nogil=True, inline="always")
def pv_scalar(w, w_off, w_stride, v, v_off, v_stride, n, a, a_off, a_stride, heads, width):
    # pv_tile's result for any `width` of dims, one element at a time
    for g in range(heads):
        for d in range(width):
            acc = a[a_off + g * a_stride + d]
            for j in range(n):
                acc = fma32(w[w_off + g * w_stride + j], kv_load(v[v_off + j * v_stride + d]), acc)
            a[a_off + g * a_stride + d] = acc

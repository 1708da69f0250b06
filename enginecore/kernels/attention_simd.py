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

from enginecore.kernels.dot import host_features
from enginecore.kernels.f16 import kv_load

F32, F16, I16, I64 = ir.FloatType(), ir.HalfType(), ir.IntType(16), ir.IntType(64)
V16 = ir.VectorType(F32, 16)
LANES = 16

# Tile shapes (they change speed, never bits): with 32 vector registers (AVX-512) a qk tile
# holds 4 heads x 2 vectors of scores and a pv tile 4 heads x 4 vectors of 16 dims; with 16
# (AVX2, where a 16-lane vector is two registers) smaller ones.
_WIDE = "avx512f" in host_features()
QK_HEADS = 4 if _WIDE else 2
PV_HEADS, PV_VECS = (4, 4) if _WIDE else (2, 2)


def _fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    fnty = ir.FunctionType(V16, [V16, V16, V16])
    return b.call(b.module.declare_intrinsic("llvm.fma.v16f32", fnty=fnty), [x, y, acc])


def _splat(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    u = b.insert_element(ir.Constant(V16, ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(u, u, ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))


def _load16(b: ir.IRBuilder, p: ir.Value, f16: bool) -> ir.Value:
    """16 consecutive KV elements (float32, or fp16 bits widened) at p as a float32 vector."""
    if not f16:
        return b.load(b.bitcast(p, V16.as_pointer()), align=4)
    v = b.load(b.bitcast(p, ir.VectorType(I16, 16).as_pointer()), align=2)
    return b.fpext(b.bitcast(v, ir.VectorType(F16, 16)), V16)


def _ptr(
    context: Any, b: ir.IRBuilder, ty: types.Array, value: ir.Value, off: ir.Value
) -> ir.Value:
    """Pointer to flat element `off` of a C-contiguous array."""
    data = context.make_array(ty)(context, b, value).data
    return b.gep(data, [off])


def _i64(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.sext(v, I64) if v.type.width < 64 else v


def _qk_variant(b: ir.IRBuilder, f16: bool, heads: int, nv: int, r: dict[str, ir.Value]) -> None:
    accs = [
        [cgutils.alloca_once_value(b, ir.Constant(V16, None)) for _ in range(nv)]  # type: ignore[no-untyped-call]
        for _ in range(heads)
    ]
    with cgutils.for_range(b, r["n"]) as loop:
        i = loop.index
        row = b.gep(r["k"], [b.mul(i, r["k_stride"])])
        ks = [_load16(b, b.gep(row, [ir.Constant(I64, LANES * c)]), f16) for c in range(nv)]
        for g in range(heads):
            qv = _splat(
                b, b.load(b.gep(r["q"], [b.add(b.mul(ir.Constant(I64, g), r["q_stride"]), i)]))
            )
            for c in range(nv):
                b.store(_fma(b, qv, ks[c], b.load(accs[g][c])), accs[g][c])
    for g in range(heads):
        base = b.gep(r["s"], [b.mul(ir.Constant(I64, g), r["s_stride"])])
        for c in range(nv):
            dst = b.bitcast(b.gep(base, [ir.Constant(I64, LANES * c)]), V16.as_pointer())
            b.store(b.load(accs[g][c]), dst, align=4)


def _pv_variant(b: ir.IRBuilder, f16: bool, heads: int, nv: int, r: dict[str, ir.Value]) -> None:
    def acc_ptr(g: int, c: int) -> ir.Value:
        at = b.add(b.mul(ir.Constant(I64, g), r["a_stride"]), ir.Constant(I64, LANES * c))
        return b.bitcast(b.gep(r["a"], [at]), V16.as_pointer())

    accs = [
        [cgutils.alloca_once_value(b, b.load(acc_ptr(g, c), align=4)) for c in range(nv)]  # type: ignore[no-untyped-call]
        for g in range(heads)
    ]
    with cgutils.for_range(b, r["n"]) as loop:
        j = loop.index
        row = b.gep(r["v"], [b.mul(j, r["v_stride"])])
        vs = [_load16(b, b.gep(row, [ir.Constant(I64, LANES * c)]), f16) for c in range(nv)]
        for g in range(heads):
            wv = _splat(
                b, b.load(b.gep(r["w"], [b.add(b.mul(ir.Constant(I64, g), r["w_stride"]), j)]))
            )
            for c in range(nv):
                b.store(_fma(b, wv, vs[c], b.load(accs[g][c])), accs[g][c])
    for g in range(heads):
        for c in range(nv):
            b.store(b.load(accs[g][c]), acc_ptr(g, c), align=4)


def _tile(kind: str, max_heads: int, max_vecs: int) -> Any:
    # kind "qk": (q, q_off, q_stride, k, k_off, k_stride, n, s, s_off, s_stride, heads, nv)
    # kind "pv": (w, w_off, w_stride, v, v_off, v_stride, n, a, a_off, a_stride, heads, nv)
    names = ("x", "x_off", "x_stride", "kv", "kv_off", "kv_stride", "n", "o", "o_off",
             "o_stride", "heads", "nv")  # fmt: skip

    def typer(typingctx: Any, x: Any, x_off: Any, x_stride: Any, kv: Any, kv_off: Any,
              kv_stride: Any, n: Any, o: Any, o_off: Any, o_stride: Any, heads: Any,
              nv: Any) -> Any:  # fmt: skip
        args = (x, x_off, x_stride, kv, kv_off, kv_stride, n, o, o_off, o_stride, heads, nv)
        if not all(isinstance(a, types.Array) and a.layout == "C" for a in (x, kv, o)):
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
            r = {
                "x": _ptr(context, b, ty["x"], v["x"], _i64(b, v["x_off"])),
                "kv": _ptr(context, b, ty["kv"], v["kv"], _i64(b, v["kv_off"])),
                "o": _ptr(context, b, ty["o"], v["o"], _i64(b, v["o_off"])),
                **{k: _i64(b, v[k]) for k in ("x_stride", "kv_stride", "n", "o_stride")},
            }
            if kind == "qk":
                r = {"q": r["x"], "q_stride": r["x_stride"], "k": r["kv"],
                     "k_stride": r["kv_stride"], "n": r["n"], "s": r["o"], "s_stride": r["o_stride"]}  # fmt: skip
            else:
                r = {"w": r["x"], "w_stride": r["x_stride"], "v": r["kv"],
                     "v_stride": r["kv_stride"], "n": r["n"], "a": r["o"], "a_stride": r["o_stride"]}  # fmt: skip
            heads, nv = _i64(b, v["heads"]), _i64(b, v["nv"])
            emit = _qk_variant if kind == "qk" else _pv_variant
            for hh in range(1, max_heads + 1):
                for vv in range(1, max_vecs + 1):
                    hit = b.and_(
                        b.icmp_signed("==", heads, ir.Constant(I64, hh)),
                        b.icmp_signed("==", nv, ir.Constant(I64, vv)),
                    )
                    with b.if_then(hit):
                        emit(b, f16, hh, vv, r)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


# qk_tile(q, q_off, q_stride, k, k_off, k_stride, n, s, s_off, s_stride, heads, nv):
# for g < heads (<= QK_HEADS) and p < 16 * nv (nv 1 or 2), flat elements of C-contiguous
# arrays: s[s_off + g s_stride + p] = sum over i < n, in order, of q[q_off + g q_stride + i]
# * k[k_off + i k_stride + p], as fmas. Any other heads / nv leave s untouched.
qk_tile = _tile("qk", QK_HEADS, 2)
# pv_tile(w, w_off, w_stride, v, v_off, v_stride, n, a, a_off, a_stride, heads, nv): for
# g < heads (<= PV_HEADS) and d < 16 * nv (nv <= PV_VECS): a[a_off + g a_stride + d] +=
# w[w_off + g w_stride + j] * v[v_off + j v_stride + d] for j = 0 .. n - 1 in order, as fmas.
pv_tile = _tile("pv", PV_HEADS, PV_VECS)


def _fma_scalar(typingctx: Any, x: Any, y: Any, acc: Any) -> Any:
    """float32 x * y + acc with one rounding (llvm.fma), as the vector tiles compute a lane."""
    if not (x == y == acc == types.float32):
        return None

    def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
        fnty = ir.FunctionType(F32, [F32, F32, F32])
        return b.call(b.module.declare_intrinsic("llvm.fma.f32", fnty=fnty), list(args))

    return types.float32(x, y, acc), codegen


fma32: Any = intrinsic(_fma_scalar)


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

"""Exact mode over the quantized panels (fp32 activations), and the row lookups of every mode.

Few rows stream the panels with lane-parallel fp32 sums (kernels/simd.py). Many rows
dequantize a tile of panels at a time into a cache-sized fp32 buffer, 16 weights per vector
instruction (an LLVM intrinsic: numba's own loops ran several times slower), and multiply
it by a single-threaded sgemm (kernels/gemm.py); no dense copy of a matrix is ever kept. A
weight is sc * (v - off) + mn exactly as gguf.quants.dequantize computes it
(kernels/panels.py has the format), in a tile as in an embedding lookup, bit for bit.
"""

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from enginecore.kernels import gemm
from enginecore.kernels.dot import HIGH_BYTES, I8, I16, I32, I64, lane_values, vec
from enginecore.kernels.panels import LANES, group_values, high_bit, panel_kind, sub_scales
from enginecore.kernels.simd import panel_kernel

F32 = ir.FloatType()
V16 = vec(F32, 16)
# Exact mode, many rows: the fp32 tile of weights one sgemm call multiplies, at most (bytes;
# 64 KB to 2 MB measured on the bundled model at 16-64 rows: 64-512 KB within noise, larger
# slower, and a tile of one panel (a matrix of K >= 1024 at 64 KB) was slow at 64 rows)
TILE_BYTES = 256 * 1024


@njit(cache=True, nogil=True)
def block_sums(x, sub, xs):  # x (n, K) float32 -> xs (n, K // sub) sums per sub-block
    for t in range(x.shape[0]):
        for j in range(xs.shape[1]):
            s = np.float32(0.0)
            for i in range(sub):
                s += x[t, j * sub + i]
            xs[t, j] = s


@njit(parallel=True, cache=True, nogil=True)
def f32_matmul(x, xs, fmt, out, col0, n_rows, parts):
    # exact mode, few rows: out[t, col0 + row] = sum over sub-blocks of
    # sc * sum_k (v_k - off) x_k + mn * xs (kernels/simd.py); lanes uint32, one row per lane
    lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = x.shape
    P = lanes.shape[0]
    n_sub = K // sub
    panel_bytes = lanes.shape[1] * 4
    five = hb.shape[1] > 0
    unused = np.empty(1, np.int32)
    step = -(-P // parts)
    kind = panel_kind(four_bit, five, False)  # (exact mode: any offset, no folding)
    for part in prange(parts):
        acc = np.empty(LANES, np.float32)
        for p in range(part * step, min(P, part * step + step)):
            for t in range(n):
                panel_kernel(kind, 1, 1, lanes, p * panel_bytes, hb, p * hb.shape[1], x, t * K, 0,
                             xs, t * n_sub, unused, 0, d, dm, isc, imn, p * d.shape[1] * LANES,
                             p * isc.shape[1] * LANES, sps, has_min, n_sub, sub, off, acc)  # fmt: skip
                for r in range(min(LANES, n_rows - p * LANES)):
                    out[t, col0 + p * LANES + r] = acc[r]


@njit(cache=True, nogil=True, inline="always")
def _weight(v, off, sc, mn, has_min):
    w = sc * np.float32(np.int64(v) - off)
    if has_min:
        w = w + mn
    return w


def _vector(b: ir.IRBuilder, base: ir.Value, index: ir.Value, ty: ir.VectorType) -> ir.Value:
    """The index-th vector of type ty at byte pointer base."""
    size = ty.count * (ty.element.width // 8 if isinstance(ty.element, ir.IntType) else 4)
    ptr = b.gep(base, [b.mul(index, ir.Constant(I64, size))])
    return b.load(b.bitcast(ptr, ty.as_pointer()), align=1)


def _row_scales(b: ir.IRBuilder, f16s: ir.Value, ints: ir.Value | None, j: ir.Value,
                sps: ir.Value) -> ir.Value:  # fmt: skip
    """16 rows' float32 scale (or minimum) of sub-block j: the fp16 one of its super-block,
    times the int8 one of the sub-block when there is one (ints not None)."""
    half = b.bitcast(_vector(b, f16s, b.udiv(j, sps), vec(I16, 16)), vec(ir.HalfType(), 16))
    v = b.fpext(half, V16)
    if ints is not None:
        v = b.fmul(v, b.sitofp(_vector(b, ints, j, vec(I8, 16)), V16))
    return v


def _emit_tile(b: ir.IRBuilder, four_bit: bool, has_min: bool, scaled: bool,
               r: dict[str, ir.Value], five: bool) -> None:  # fmt: skip
    """tile[k, 0:16] = the 16 rows' weight k, for every k: sc * (float(v) - off) (+ mn), fp32
    mul then add without fast-math flags, as gguf.quants.dequantize computes them; 5-bit
    values with their fifth bits from hb (kernels/dot.py)."""
    per_group = 8 if four_bit else 4
    groups = b.udiv(r["sub"], ir.Constant(I64, per_group))
    off = b.sitofp(r["off"], F32)
    offv = b.shuffle_vector(
        b.insert_element(ir.Constant(V16, ir.Undefined), off, ir.Constant(I32, 0)),
        ir.Constant(V16, ir.Undefined), ir.Constant(vec(I32, 16), [0] * 16),
    )  # fmt: skip
    row_bytes = b.mul(r["ld"], ir.Constant(I64, 4))
    with cgutils.for_range(b, r["n_sub"]) as loop:
        j = loop.index
        sc = _row_scales(b, r["d"], r["isc"] if scaled else None, j, r["sps"])
        mn = _row_scales(b, r["dm"], r["imn"] if scaled else None, j, r["sps"]) if has_min else None
        with cgutils.for_range(b, groups) as inner:
            g = b.add(b.mul(j, groups), inner.index)
            lanes = _vector(b, r["w"], g, vec(I32, 16))
            k0 = b.mul(g, ir.Constant(I64, per_group))

            def put(values: ir.Value, k: int) -> None:
                w = b.fmul(sc, b.fsub(b.sitofp(values, V16), offv))
                if mn is not None:
                    w = b.fadd(w, mn)
                dst = b.gep(r["tile"], [b.mul(b.add(k0, ir.Constant(I64, k)), row_bytes)])
                b.store(w, b.bitcast(dst, V16.as_pointer()), align=4)

            hb = b.gep(r["hb"], [b.mul(g, ir.Constant(I64, HIGH_BYTES))]) if five else None
            for dk, values in lane_values(b, lanes, four_bit, hb):
                put(values, dk)


def _panel_to_tile(four_bit: bool, five: bool = False) -> Any:
    def typer(typingctx: Any, lanes: Any, hb: Any, p: Any, d: Any, dm: Any, isc: Any, imn: Any,
              sps: Any, off: Any, sub: Any, has_min: Any, tile: Any, c0: Any) -> Any:  # fmt: skip
        names = ("lanes", "hb", "p", "d", "dm", "isc", "imn", "sps", "off", "sub", "has_min",
                 "tile", "c0")  # fmt: skip
        sig = types.void(lanes, hb, p, d, dm, isc, imn, sps, off, sub, has_min, tile, c0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            v = dict(zip(names, args, strict=True))
            ty = dict(zip(names, sig.args, strict=True))

            def i64(name: str) -> ir.Value:
                x = v[name]
                return builder.sext(x, I64) if x.type.width < 64 else x

            def array(name: str) -> Any:
                return context.make_array(ty[name])(context, builder, v[name])

            def panel(name: str) -> ir.Value:  # byte pointer to panel p of a (P, ...) array
                a = array(name)
                stride = cgutils.unpack_tuple(builder, a.strides)[0]  # type: ignore[no-untyped-call]
                data = builder.bitcast(a.data, I8.as_pointer())
                return builder.gep(data, [builder.mul(i64("p"), stride)])

            t = array("tile")
            rows = cgutils.unpack_tuple(builder, t.shape)[0]  # type: ignore[no-untyped-call]
            ld = builder.udiv(cgutils.unpack_tuple(builder, t.strides)[0], ir.Constant(I64, 4))  # type: ignore[no-untyped-call]
            first = builder.gep(builder.bitcast(t.data, I8.as_pointer()),
                                [builder.mul(i64("c0"), ir.Constant(I64, 4))])  # fmt: skip
            r = {"w": panel("lanes"), "hb": panel("hb"), "d": panel("d"), "dm": panel("dm"),
                 "isc": panel("isc"), "imn": panel("imn"), "sps": i64("sps"), "off": i64("off"), "sub": i64("sub"),
                 "n_sub": builder.udiv(rows, i64("sub")), "ld": ld, "tile": first}  # fmt: skip
            has_min = builder.icmp_unsigned("!=", v["has_min"], ir.Constant(v["has_min"].type, 0))
            scaled = builder.icmp_unsigned(">", r["sps"], ir.Constant(I64, 1))
            with builder.if_else(has_min) as (with_min, without):
                for flag, block in ((True, with_min), (False, without)):
                    with block, builder.if_else(scaled) as (sub_scaled, plain):
                        with sub_scaled:
                            _emit_tile(builder, four_bit, flag, True, r, five)
                        with plain:
                            _emit_tile(builder, four_bit, flag, False, r, five)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


# panel_to_tile_4 / _5 / _8(lanes, hb, p, d, dm, isc, imn, sps, off, sub, has_min, tile, c0):
# columns c0 .. c0 + 16 of tile (K, cols) float32 = the weights of panel p's 16 rows (lanes
# uint32; _5: the fifth bits in hb), tile[k, c0 + r] = weight k of row r, bit for bit what the
# embedding lookup gives
panel_to_tile_4 = _panel_to_tile(True)
panel_to_tile_5 = _panel_to_tile(True, five=True)
panel_to_tile_8 = _panel_to_tile(False)


@njit(cache=True, nogil=True)
def fill_tile(fmt, p0, p1, tile):
    # tile[:, 16 (p - p0) + r] = row r of panel p (its weights along K), p0 <= p < p1
    lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    for p in range(p0, p1):
        c0 = (p - p0) * LANES
        if hb.shape[1] > 0:
            panel_to_tile_5(lanes, hb, p, d, dm, isc, imn, sps, off, sub, has_min, tile, c0)
        elif four_bit:
            panel_to_tile_4(lanes, hb, p, d, dm, isc, imn, sps, off, sub, has_min, tile, c0)
        else:
            panel_to_tile_8(lanes, hb, p, d, dm, isc, imn, sps, off, sub, has_min, tile, c0)


@njit(parallel=True, cache=True, nogil=True)
def f32_gemm(x, fmt, out, col0, n_rows, parts):
    # exact mode, many rows: each thread dequantizes a tile of panels at a time into a (K,
    # 16 * panels) fp32 buffer of at most TILE_BYTES and multiplies x by it with sgemm on its
    # own thread; the threads take the tiles in turn
    K = x.shape[1]
    P = fmt[0].shape[0]
    per_tile = max(1, min(TILE_BYTES // (K * LANES * 4), -(-P // parts)))
    n_tiles = -(-P // per_tile)
    for part in prange(parts):
        tile = np.empty((K, per_tile * LANES), np.float32)
        for ti in range(part, n_tiles, parts):
            p0 = ti * per_tile
            p1 = min(P, p0 + per_tile)
            fill_tile(fmt, p0, p1, tile)
            c0 = p0 * LANES
            cols = min(n_rows, p1 * LANES) - c0
            gemm.sgemm_serial(x, tile[:, :cols], out[:, col0 + c0 : col0 + c0 + cols], False)


@njit(parallel=True, cache=True, nogil=True)
def dequantize_rows(ids, fmt, out):
    # out (n, K) float32 = rows ids of the matrix (an embedding lookup); lanes uint32 or
    # uint16 (4 or 2 bytes per row and group; two words with 4-bit weights; hb: 5-bit ones'
    # fifth bits; 8-bit ones in uint16 lanes as v - off, int8)
    lanes, hb, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = out.shape
    il = lanes.itemsize
    per_group = group_values(lanes, four_bit)
    for t in prange(n):
        p, r = ids[t] // LANES, ids[t] % LANES
        for k in range(K):
            g, rem = k // per_group, k % per_group
            if four_bit and il == 2:  # two words per row: nibble q of word e is 2q + e
                word = lanes[p, g * 2 * LANES + 2 * r + rem % 2]
                v = (np.int64(word) >> (4 * (rem // 2))) & 15
                v += high_bit(hb, p, g, rem // 2, 2 * r + rem % 2, 32)
            else:
                shift = 8 * rem
                mask = 255
                if four_bit:
                    shift = 8 * (rem % il) + 4 * (rem // il)
                    mask = 15
                v = (np.int64(lanes[p, g * LANES + r]) >> shift) & mask
                if four_bit:
                    v += high_bit(hb, p, g, rem // il, il * r + rem % il, 64)
                elif il == 2:  # v - off as int8 (kernels/dot.py)
                    v = v - 256 + off if v > 127 else v + off
            sc, mn = sub_scales(d, dm, isc, imn, p, sps, has_min, k // sub, r)
            out[t, k] = _weight(v, off, sc, mn, has_min)

"""One 16-row weight panel times one quantized activation row, as an LLVM intrinsic: the exact
int32 sums of every sub-block (kernels/dot.py) combined with their scales in float32.

A weight sc * (v - off) + mn is sc * v + c, with c = fma(-off, sc, mn) per row and sub-block
(mn = 0 for types without minimums). Per output row, sub-block by sub-block in order:
P = xa * float(S) (S the exact sum of v times the activations of the sub-block's activation
block, xa that block's scale; a sub-block longer than an activation block, int8's 16 values
in a sub-block of 32, goes on with P = fma(xa, float(S), P) for its next block), then
tmp = fma(c, xb, sc * P) (xb: the sub-block's dequantized activations' sum, made once by the
quantizer: kernels/panels.py's xb_index) and acc = acc + tmp (one add on the chain that
carries from sub-block to sub-block, which bounds a lone row). With int16 activations, Q5_0
(SIGNED_FIVE: an offset and no minimum) has its values unpacked as v - off and 8-bit types
(all with an offset and no minimum) keep them so (kernels/dot.py), so that S holds the
offset's part and tmp = sc * P: one float operation fewer per row and sub-block on the pipes
the multiply-adds use (bench/README). Plain fmul and fadd and
explicit fused multiply-adds (llvm.fma, rounded once on every path; `fma32` for the portable
loop), no fast-math flags: a portable numba loop doing the same scalar operations
(kernels/panels.py) gets the same bits.
"""

from __future__ import annotations

import inspect
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from enginecore.kernels.dot import (
    ACT_ROWS,
    HIGH_BYTES,
    I8,
    I16,
    I32,
    I64,
    PREFETCH_BYTES,
    Emitter,
    Isa,
    accumulate_groups,
    as_i64,
    group_layout,
    lane_values,
    load_at,
    paths_of,
    prefetch,
    supported,
    vec,
    with_high,
    word_nibbles,
)

F32, F16 = ir.FloatType(), ir.HalfType()


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x * y + z rounded once (llvm.fma: the same bits on every path and CPU); float32 or
    <16 x float>."""
    name = "llvm.fma.f32" if x.type == F32 else "llvm.fma.v16f32"
    fnty = ir.FunctionType(x.type, [x.type] * 3)
    return b.call(b.module.declare_intrinsic(name, fnty=fnty), [x, y, z])


def _fma32(typingctx: Any, x: Any, y: Any, z: Any) -> Any:
    if not x == y == z == types.float32:
        return None

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        return fma(builder, *args)

    return types.float32(x, y, z), codegen


# fma32(x, y, z) float32: x * y + z rounded once, for the portable loops (kernels/panels.py,
# kernels/attention_simd.py)
fma32: Any = intrinsic(_fma32)


def splat_f(b: ir.IRBuilder, v: ir.Value, n: int = 16) -> ir.Value:
    """A float32 repeated over n lanes."""
    u = b.insert_element(ir.Constant(vec(F32, n), ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(vec(I32, n), [0] * n))


def f16x16(b: ir.IRBuilder, f16s: ir.Value) -> ir.Value:
    """16 fp16 values (at f16s) widened to float32."""
    v = b.load(b.bitcast(f16s, vec(I16, 16).as_pointer()), align=1)
    return b.fpext(b.bitcast(v, vec(F16, 16)), vec(F32, 16))


def _times_int8(b: ir.IRBuilder, v: ir.Value, ints: ir.Value, scaled: ir.Value) -> ir.Value:
    """v times the 16 int8 values at ints when `scaled` (i1), else v."""
    out = cgutils.alloca_once_value(b, v)  # type: ignore[no-untyped-call]
    with b.if_then(scaled):
        i8s = b.load(b.bitcast(ints, vec(I8, 16).as_pointer()), align=1)
        b.store(b.fmul(v, b.sitofp(i8s, vec(F32, 16))), out)
    return b.load(out)


def _scale16(b: ir.IRBuilder, f16s: ir.Value, ints: ir.Value, scaled: ir.Value) -> ir.Value:
    """fp16 values (at f16s) widened, times int8 ones (at ints) when `scaled` (i1)."""
    return _times_int8(b, f16x16(b, f16s), ints, scaled)


def _emit_rows(
    b: ir.IRBuilder, isa: Isa, int16: bool, four_bit: bool, rows: int, r: dict[str, ir.Value],
    five: int, words: bool = False,
) -> None:  # fmt: skip
    """out[16 t : 16 t + 16] for `rows` consecutive activation rows t: the sums over
    sub-blocks of the module docstring, in its order per lane. The rows share each weight
    load and scale.

    The sub-block length (16 or 32) is a constant of the code emitted for it, so that a
    sub-block's groups are straight-line code with constant offsets; so is the distance
    between a row's words (kernels/dot.py's ACT_ROWS) wherever it is known: inside a full
    group of rows (4 ACT_ROWS bytes), which is all the widest kernels (WIDE, DOUBLE) get and
    most of what the 4-row ones do, and for a lone row's own (4: a decode of one sequence,
    contiguous); any other stride stays a run-time value."""
    for sub in (16, 32):
        with b.if_then(b.icmp_unsigned("==", r["sub"], ir.Constant(I64, sub))):

            def emit(stride: ir.Value, sub: int = sub) -> None:
                _emit_sub_rows(b, isa, int16, four_bit, rows, sub, stride, r, five, words)

            known = ir.Constant(I64, 4 * ACT_ROWS if rows > 1 else 4)
            if rows >= ACT_ROWS:
                emit(known)
                continue
            with b.if_else(b.icmp_unsigned("==", r["x_stride"], known)) as (then, otherwise):
                with then:
                    emit(known)
                with otherwise:
                    emit(r["x_stride"])


def _emit_sub_rows(
    b: ir.IRBuilder, isa: Isa, int16: bool, four_bit: bool, rows: int, sub: int,
    stride: ir.Value, r: dict[str, ir.Value], five: int, words: bool = False,
) -> None:  # fmt: skip
    # independent accumulator chains hide the multiply-add latency: for one activation row 4
    # of the 32 zmm registers (2 of the 16 ymm on the 256-bit paths); several rows give as
    # many chains already, but a sub-block's 16 multiply-adds in a row on one accumulator
    # still filled the scheduler before the next sub-block could start, so 2 each on 512-bit
    # (16 of the 32 zmm for 8 rows; the 256-bit paths have no registers to spare); DOUBLE's
    # 16 rows are 16 chains with one accumulator each.
    # 4-bit weights, int16 activations, one row, 512-bit: the four nibble positions are four
    # independent accumulators already (kernels/dot.py's planes), so no more chains
    planes = rows == 1 and int16 and four_bit and isa == Isa.AVX512_VNNI
    if planes or rows > ACT_ROWS:
        chains = 1
    elif isa == Isa.AVX512_VNNI:
        chains = 2 if rows > 1 else 4
    else:
        chains = 1 if rows > 1 else 2
    ems = [Emitter(b, isa, int16, four_bit, chains, planes) for _ in range(rows)]
    ahead = PREFETCH_BYTES if rows < ACT_ROWS and not words else 0
    zero = ir.Constant(vec(F32, 16), None)
    accs = [cgutils.alloca_once_value(b, zero) for _ in range(rows)]  # type: ignore[no-untyped-call]
    elem = 2 if int16 else 1
    group_bytes, per_group = group_layout(int16, four_bit, words)  # per_group: values of k
    gpsub = sub // per_group
    ab = 32 if int16 else 16  # activations per scale (kernels/panels.py's act_block)
    pieces = max(sub // ab, 1)
    plen = sub // pieces  # k values per piece: a sub-block, or an activation block inside it
    gpp = plen // per_group
    parts = [cgutils.alloca_once_value(b, zero) for _ in range(rows)]  # type: ignore[no-untyped-call]
    scaled = b.icmp_unsigned(">", r["sps"], ir.Constant(I64, 1))
    c16 = ir.Constant(I64, 16)
    mn = cgutils.alloca_once_value(b, zero)  # type: ignore[no-untyped-call]
    # SIGNED_FIVE or 8-bit values with int16 activations: the values come as v - off
    # (kernels/dot.py), so S holds the offset's part and c (no minimum either) is 0: tmp = sc * P
    fold = int16 and (five == SIGNED_FIVE or not four_bit)
    neg_off = splat_f(b, b.sitofp(b.neg(r["off"]), F32))
    n_act = r["n_act"]  # xa and xb: one column per activation row
    k = b.mul(r["n_sub"], ir.Constant(I64, sub))  # activation row length
    # super-blocks, then their sub-blocks: the super-block scales without a division
    with cgutils.for_range(b, b.udiv(r["n_sub"], r["sps"])) as outer:
        big_j = outer.index
        dv = f16x16(b, b.gep(r["d"], [b.mul(big_j, c16)]))
        dmv = cgutils.alloca_once_value(b, zero)  # type: ignore[no-untyped-call]
        with b.if_then(r["has_min"]):
            b.store(f16x16(b, b.gep(r["dm"], [b.mul(big_j, c16)])), dmv)
        with cgutils.for_range(b, r["sps"]) as inner:
            j = b.add(b.mul(big_j, r["sps"]), inner.index)
            sc = _times_int8(b, dv, b.gep(r["isc"], [b.mul(j, c16)]), scaled)
            b.store(zero, mn)
            with b.if_then(r["has_min"]):
                b.store(_times_int8(b, b.load(dmv), b.gep(r["imn"], [b.mul(j, c16)]), scaled), mn)
            c = fma(b, neg_off, sc, b.load(mn))
            for h in range(pieces):  # the sub-block's activation blocks (one when longer)
                for em in ems:
                    em.reset()
                k0 = b.add(b.mul(j, ir.Constant(I64, sub)), ir.Constant(I64, h * plen))
                w = b.gep(r["w"], [b.add(b.mul(j, ir.Constant(I64, gpsub * group_bytes)),
                                         ir.Constant(I64, h * gpp * group_bytes))])  # fmt: skip
                # the rows' activations from k0 (word k0 * elem / 4): constant offsets
                x0 = b.gep(r["x"], [b.mul(b.udiv(k0, ir.Constant(I64, 4 // elem)), stride)])
                xs = [(em, x0, 4 * t) for t, em in enumerate(ems[:ACT_ROWS])]
                if rows > ACT_ROWS:  # DOUBLE: the next group's rows, ACT_ROWS * K values on
                    x1 = b.gep(x0, [b.mul(k, ir.Constant(I64, ACT_ROWS * elem))])
                    xs += [(em, x1, 4 * t) for t, em in enumerate(ems[ACT_ROWS:])]
                hb = None
                if five and not words:  # the fifth bits of the same groups
                    hb = b.gep(r["hb"], [b.add(b.mul(j, ir.Constant(I64, gpsub * HIGH_BYTES)),
                                               ir.Constant(I64, h * gpp * HIGH_BYTES))])  # fmt: skip
                accumulate_groups(b, xs, four_bit, w, gpp, stride, ahead, hb, fold, words)
                # the rows' scales: one column of xa, its rows at constant offsets
                xa = b.gep(r["xa"], [b.mul(b.udiv(k0, ir.Constant(I64, ab)), n_act)])
                for t, em in enumerate(ems):
                    a = splat_f(b, b.load(b.gep(xa, [ir.Constant(I64, t)])))
                    fs = b.sitofp(em.sums(), vec(F32, 16))
                    part = b.fmul(a, fs) if h == 0 else fma(b, a, fs, b.load(parts[t]))
                    b.store(part, parts[t])
            # the rows' activation sums: one row of xb (kernels/panels.py's xb_index)
            xb_row = j if sub == 16 else b.add(b.udiv(k, ir.Constant(I64, 16)), j)
            xb = b.gep(r["xb"], [b.mul(xb_row, n_act)])
            for t in range(rows):
                tmp = b.fmul(sc, b.load(parts[t]))
                if not fold:  # (folded: one operation fewer on the multiply-adds' pipes)
                    xs_t = splat_f(b, b.load(b.gep(xb, [ir.Constant(I64, t)])))
                    tmp = fma(b, c, xs_t, tmp)
                b.store(b.fadd(b.load(accs[t]), tmp), accs[t])
    for t, acc in enumerate(accs):
        out = b.gep(b.bitcast(r["out"], vec(F32, 16).as_pointer()), [ir.Constant(I64, t)])
        b.store(b.load(acc), out, align=4)


def _emit_exact_row(b: ir.IRBuilder, four_bit: bool, r: dict[str, ir.Value], five: int) -> None:
    """Exact mode (fp32 activations, 4 bytes per row and group): out[0:16] = sum over
    sub-blocks of sc * sum_k (v_k - off) x_k (+ mn * xs), fused multiply-adds allowed; 5-bit
    values with their fifth bits from hb (kernels/dot.py)."""
    v16 = vec(F32, 16)
    acc = cgutils.alloca_once_value(b, ir.Constant(v16, None))  # type: ignore[no-untyped-call]
    s = cgutils.alloca_once_value(b, ir.Constant(v16, None))  # type: ignore[no-untyped-call]
    per_group = 8 if four_bit else 4
    gpsub = b.udiv(r["sub"], ir.Constant(I64, per_group))
    offv = splat_f(b, b.sitofp(r["off"], F32))
    scaled = b.icmp_unsigned(">", r["sps"], ir.Constant(I64, 1))
    fma = b.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(v16, [v16] * 3))

    def add(values: ir.Value, k: ir.Value) -> None:
        xk = splat_f(b, b.load(b.gep(r["x"], [k])))
        b.store(b.call(fma, [b.fsub(b.sitofp(values, v16), offv), xk, b.load(s)]), s)

    with cgutils.for_range(b, r["n_sub"]) as loop:
        j = loop.index
        b.store(ir.Constant(v16, None), s)
        with cgutils.for_range(b, gpsub) as inner:
            g = b.add(b.mul(j, gpsub), inner.index)
            wv = load_at(b, r["w"], b.mul(g, ir.Constant(I64, 64)), vec(I32, 16))
            k0 = b.mul(g, ir.Constant(I64, per_group))
            hb = b.gep(r["hb"], [b.mul(g, ir.Constant(I64, HIGH_BYTES))]) if five else None
            for dk, values in lane_values(b, wv, four_bit, hb):
                add(values, b.add(k0, ir.Constant(I64, dk)))
        big_j = b.udiv(j, r["sps"])
        sc = _scale16(b, b.gep(r["d"], [b.mul(big_j, ir.Constant(I64, 16))]),
                      b.gep(r["isc"], [b.mul(j, ir.Constant(I64, 16))]), scaled)  # fmt: skip
        tmp = cgutils.alloca_once_value(b, b.fmul(sc, b.load(s)))  # type: ignore[no-untyped-call]
        with b.if_then(r["has_min"]):
            mn = _scale16(b, b.gep(r["dm"], [b.mul(big_j, ir.Constant(I64, 16))]),
                          b.gep(r["imn"], [b.mul(j, ir.Constant(I64, 16))]), scaled)  # fmt: skip
            xs = splat_f(b, b.load(b.gep(r["xa"], [j])))
            b.store(b.fadd(b.load(tmp), b.fmul(mn, xs)), tmp)
        b.store(b.fadd(b.load(acc), b.load(tmp)), acc)
    b.store(b.load(acc), b.bitcast(r["out"], v16.as_pointer()), align=4)


def _data(context: Any, builder: ir.IRBuilder, ty: types.Array, value: ir.Value) -> ir.Value:
    return builder.bitcast(context.make_array(ty)(context, builder, value).data, I8.as_pointer())


# `five` of the kernels: 0 no fifth bits, 1 5-bit values v, SIGNED_FIVE 5-bit values with an
# offset and no minimum (Q5_0), which int16 activations multiply as v - off
SIGNED_FIVE = 2

# The kinds of panel a kernel multiplies: (four_bit, five, words) of the emitters. WORDS: 4-
# and 5-bit values that unpack_words has made int16 words (int16 activations on AVX2 only,
# WORDS_ISA): multiplied as they are, so the many rows of a prefill or a large batch unpack
# each panel once, not once per ROWS rows (the unpack was 3 of the 19 vector instructions per
# row and 128 multiply-adds there); the sums are the same integers, the result the same bits.
FOUR, FIVE, FIVE_SIGNED, EIGHT, WORDS = range(5)
_KINDS = {
    FOUR: (True, 0, False), FIVE: (True, 1, False), FIVE_SIGNED: (True, SIGNED_FIVE, False),
    EIGHT: (False, 0, False), WORDS: (True, 0, True),
}  # fmt: skip
# activation rows a call multiplies: 1, ROWS, or WIDE (always a full group, x_stride 4 *
# ACT_ROWS); DOUBLE two full groups, one weight load and unpack for 16 rows (AVX512_VNNI only)
ROWS, WIDE, DOUBLE = 4, ACT_ROWS, 2 * ACT_ROWS
DOUBLE_ISA = int(Isa.AVX512_VNNI)  # the one path DOUBLE's kernels are emitted for
WORDS_ISA = int(Isa.AVX2)  # the one path WORDS' kernels are emitted for
# the path that multiplies int16 activation rows ROWS at a time, and has no WIDE kernels for
# them: 8 rows' sums spilled its 16 ymm (kernels/panels.py's _panel asks for none)
NO_WIDE_INT16_ISA = int(Isa.AVX2)


def _variants(xq: types.Array, lanes: Any) -> list[tuple[int, int]]:
    """(kind, rows) a call site with these types can run: words come as an int16 array, any
    other panel as its lanes; exact mode (float32 xq) one row at a time."""
    int16 = xq.dtype == types.int16
    if isinstance(lanes, types.Array) and lanes.dtype == types.int16:
        return [(WORDS, 1), (WORDS, ROWS)] if int16 else []
    if xq.dtype == types.float32:
        return [(FOUR, 1), (FIVE, 1), (EIGHT, 1)]
    return [(k, r) for k in (FOUR, FIVE, FIVE_SIGNED, EIGHT) for r in (1, ROWS, WIDE, DOUBLE)]


def _emit_variant(
    b: ir.IRBuilder, kind: int, rows: int, xq: types.Array, isa: Any, r: dict[str, ir.Value],
    isa_value: ir.Value | None,
) -> None:  # fmt: skip
    """The kernel of one kind and row count: every path this host runs that it has (isa an
    int: each compared with isa_value at run time; a dot.Path: that path alone)."""
    four_bit, five, words = _KINDS[kind]
    if xq.dtype == types.float32:
        _emit_exact_row(b, four_bit, r, five)
        return
    int16 = xq.dtype == types.int16
    one = paths_of(isa)
    # only what this host runs is ever emitted
    paths = [p for p in one or supported() if p != Isa.PORTABLE and p in supported()]
    if rows > ACT_ROWS:  # DOUBLE: 512-bit only (the 256-bit paths' 16 ymm would spill)
        paths = [p for p in paths if p == DOUBLE_ISA]
    if rows == WIDE and int16:
        paths = [p for p in paths if p != NO_WIDE_INT16_ISA]
    if words:
        paths = [p for p in paths if p == WORDS_ISA]
    for path in paths:
        if one:
            _emit_rows(b, path, int16, four_bit, rows, r, five, words)
            continue
        assert isa_value is not None
        with b.if_then(b.icmp_signed("==", isa_value, ir.Constant(I64, int(path)))):
            _emit_rows(b, path, int16, four_bit, rows, r, five, words)


def _panel_kernel(
    typingctx: Any, kind: Any, rows: Any, isa: Any, lanes: Any, w_off: Any, hb: Any, h_off: Any,
    xq: Any, x_off: Any, x_stride: Any, xa: Any, xa_off: Any, xb: Any, xb_off: Any, d: Any,
    dm: Any, isc: Any, imn: Any, s_off: Any, sub_off: Any, sps: Any, has_min: Any, n_sub: Any,
    sub: Any, off: Any, out: Any,
) -> Any:  # fmt: skip
    argtys = (kind, rows, isa, lanes, w_off, hb, h_off, xq, x_off, x_stride, xa, xa_off, xb,
              xb_off, d, dm, isc, imn, s_off, sub_off, sps, has_min, n_sub, sub, off, out)  # fmt: skip
    ty = dict(zip(_NAMES, argtys, strict=True))
    if not (isinstance(xq, types.Array) and xq.dtype in (types.int8, types.int16, types.float32)):
        return None
    exact = xq.dtype == types.float32
    elem = 4 if exact else (2 if xq.dtype == types.int16 else 1)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        v = dict(zip(_NAMES, args, strict=True))

        def i64(name: str) -> ir.Value:
            return as_i64(builder, v[name])

        def data(name: str, elem: ir.Type, offset: str | None) -> ir.Value:
            p = builder.bitcast(_data(context, builder, ty[name], v[name]), elem.as_pointer())
            return p if offset is None else builder.gep(p, [i64(offset)])

        row = {
            "w": data("lanes", I8, "w_off"), "hb": data("hb", I8, "h_off"),
            "x": data("xq", F32, "x_off") if exact else builder.gep(data("xq", I8, None), [builder.mul(i64("x_off"), ir.Constant(I64, elem))]),
            "xa": data("xa", F32, "xa_off"), "xb": data("xb", F32, "xb_off"),
            "d": data("d", I16, "s_off"), "dm": data("dm", I16, "s_off"),
            "isc": data("isc", I8, "sub_off"), "imn": data("imn", I8, "sub_off"),
            "out": data("out", F32, None), "sps": i64("sps"), "n_sub": i64("n_sub"),
            "sub": i64("sub"), "off": i64("off"), "x_stride": i64("x_stride"),
            "has_min": builder.icmp_unsigned("!=", v["has_min"], ir.Constant(v["has_min"].type, 0)),
            "n_act": builder.extract_value(context.make_array(ty["xa"])(context, builder, v["xa"]).shape, 1),
        }  # fmt: skip
        isa_value = None if paths_of(isa) else i64("isa")  # (a Path has no value)
        for k, n in _variants(xq, lanes):
            hit = builder.and_(
                builder.icmp_signed("==", i64("kind"), ir.Constant(I64, k)),
                builder.icmp_signed("==", i64("rows"), ir.Constant(I64, n)),
            )
            with builder.if_then(hit):
                _emit_variant(builder, k, n, xq, isa, row, isa_value)
        return context.get_dummy_value()

    return types.void(*argtys), codegen


# panel_kernel(kind, rows, isa, lanes, w_off, hb, h_off, xq, x_off, x_stride, xa, xa_off, xb,
# xb_off, d, dm, isc, imn, s_off, sub_off, sps, has_min, n_sub, sub, off, out): out[16 t : 16 t
# + 16] float32 = one panel's 16 rows (kind FOUR, FIVE, FIVE_SIGNED or EIGHT: from byte w_off
# of lanes' data; WORDS: lanes is unpack_words' int16 `out`, w_off its byte; FIVE's and
# FIVE_SIGNED's fifth bits from byte h_off of hb's data, kernels/dot.py; scales from element
# s_off of d / dm and sub_off of isc / imn) times `rows` consecutive quantized activation rows t
# (the first's first word at flat element x_off of xq, its next words x_stride bytes apart:
# kernels/dot.py's ACT_ROWS; their scales xa (K // act_block, n) and sums xb (K // 16 + K // 32,
# n) from column xa_off = xb_off, the first row's index). isa is an Isa other than PORTABLE
# that this host supports, as an int (every such path emitted, one taken at run time) or a
# dot.Path (that path alone emitted); a kind, rows or isa this call site cannot run (DOUBLE
# off AVX512_VNNI, WORDS off AVX2, WIDE with int16 activations on AVX2, an isa the host lacks)
# leaves out untouched. With float32 xq (exact mode, one row), xq's row is contiguous from
# x_off, xa (n, K // sub) holds its sums per sub-block from flat element xa_off, and x_stride,
# xb and isa are unused. One intrinsic, its arguments passed one by one: the kernel named per
# kind and rows, called with a tuple of them, made every call count its arrays' references (an
# atomic add each, on a cache line both workers share: 7-8% of a prefill's samples on the AVX2
# proxy, bench/README.md).
panel_kernel: Any = intrinsic(_panel_kernel)
_NAMES = tuple(inspect.signature(_panel_kernel).parameters)[1:]  # its arguments' names


def _unpack_words(five: bool) -> Any:
    def typer(typingctx: Any, lanes: Any, w_off: Any, hb: Any, h_off: Any, n_groups: Any,
              out: Any) -> Any:  # fmt: skip
        if not (isinstance(out, types.Array) and out.dtype == types.int16):
            return None
        sig = types.void(lanes, w_off, hb, h_off, n_groups, out)

        def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
            def at(i: int) -> ir.Value:  # array i's data from the byte its next argument says
                return b.gep(_data(context, b, sig.args[i], args[i]), [as_i64(b, args[i + 1])])

            w, hb, o = at(0), at(2), _data(context, b, sig.args[5], args[5])
            n = as_i64(b, args[4])
            with cgutils.for_range(b, n) as loop:
                g = loop.index
                at_g = b.mul(g, ir.Constant(I64, 64))
                prefetch(b, b.gep(w, [at_g]), PREFETCH_BYTES)
                wv = load_at(b, w, at_g, vec(I8, 64))
                parts, high = word_nibbles(b, wv, 0, False, False)
                hb_g = b.gep(hb, [b.mul(g, ir.Constant(I64, HIGH_BYTES))])
                for q, (part, _, _) in enumerate(parts):
                    if five:
                        part = with_high(b, part, hb_g, 4 * q, high[q])
                    dst = b.gep(o, [b.mul(b.add(b.mul(g, ir.Constant(I64, 4)),
                                                ir.Constant(I64, q)), ir.Constant(I64, 64))])  # fmt: skip
                    b.store(part, b.bitcast(dst, vec(I16, 32).as_pointer()), align=2)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


# unpack_words_4 / unpack_words_5(lanes, w_off, hb, h_off, n_groups, out): the n_groups groups
# of 4-bit int16-layout values from byte w_off of lanes' data (kernels/dot.py; _5: with their
# fifth bits from byte h_off of hb's data) as int16 words in the layout of 8-bit values with
# int16 activations, at out (int16, 128 values a group): group g's nibble p of both words is
# the pair (8 g + 2 p, 8 g + 2 p + 1), so its 32 words go to out[64 (4 g + p):] as they are
# masked (the values v, fifth bit included). Each group first asks for the line PREFETCH_BYTES
# further: the kernel calls that follow an unpack read the words, not the lanes, so the
# hardware's prefetcher had stopped short of the next panel, and each unpack began with its
# first lines from DRAM (bench.ab --base 3b3de65 --cases steps on the AVX2 proxy, with
# panels.py's WORDS_SHORT_ROWS: decode B=64 0.961x / 0.988x best, prefill 256 0.974x / 0.980x
# in two runs, same bits).
unpack_words_4 = _unpack_words(False)
unpack_words_5 = _unpack_words(True)


def _quantize_block(
    typingctx: Any, x: Any, x_off: Any, qmax: Any, q: Any, words: Any, w_off: Any, w_stride: Any
) -> Any:
    # the numba loops this replaces (kernels/panels.py's _quantize_row) stayed scalar, ~5
    # cycles a value: a 16-row quantization of K = 1536 took 41 us, a tenth of its matmul
    if not (isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"):
        return None
    if not (isinstance(q, types.Array) and q.dtype in (types.int8, types.int16)):
        return None
    if not (isinstance(words, types.Array) and words.dtype == types.int32):
        return None
    n = 32 if q.dtype == types.int16 else 16  # kernels/panels.py's act_block
    ret = types.Tuple((types.float32, types.int32, types.int32))  # type: ignore[no-untyped-call]

    def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
        xv_ty, qt = vec(F32, n), ir.IntType(q.dtype.bitwidth)
        xp = b.gep(context.make_array(sig.args[0])(context, b, args[0]).data, [as_i64(b, args[1])])
        xs = b.load(b.bitcast(xp, xv_ty.as_pointer()), align=4)

        def call(name: str, ret_ty: ir.Type, *vals: ir.Value) -> ir.Value:
            fnty = ir.FunctionType(ret_ty, [v.type for v in vals])
            return b.call(b.module.declare_intrinsic(name, fnty=fnty), list(vals))

        # max |x| as the largest of the bits with the sign cleared: for floats that are not
        # NaN their order as integers (a float max without fast-math flags scalarized: ~100
        # cycles a block)
        bits = b.and_(b.bitcast(xs, vec(I32, n)), ir.Constant(vec(I32, n), [0x7FFFFFFF] * n))
        amax = b.bitcast(call(f"llvm.vector.reduce.umax.v{n}i32", I32, bits), F32)
        qf = b.sitofp(args[2], F32)
        inv = b.select(b.fcmp_ordered(">", amax, ir.Constant(F32, 0.0)), b.fdiv(qf, amax),
                       ir.Constant(F32, 0.0))  # fmt: skip
        # floor(x * inv + 0.5) clamped as numba's max(v, lo), min(v, hi) select: unfused
        v = b.fadd(b.fmul(xs, splat_f(b, inv, n)), splat_f(b, ir.Constant(F32, 0.5), n))
        v = call(f"llvm.floor.v{n}f32", xv_ty, v)
        lo, hi = splat_f(b, b.fneg(qf), n), splat_f(b, qf, n)
        v = b.select(b.fcmp_ordered(">", lo, v), lo, v)
        v = b.select(b.fcmp_ordered("<", hi, v), hi, v)
        qv = b.fptosi(v, vec(qt, n))
        # the block's words (two int16 or four int8 values each) from word w_off of `words`,
        # w_stride apart: one vector store when they are contiguous
        n_words = n * q.dtype.bitwidth // 32
        wv = b.bitcast(qv, vec(I32, n_words))
        w0 = b.gep(context.make_array(sig.args[4])(context, b, args[4]).data, [as_i64(b, args[5])])
        stride = as_i64(b, args[6])
        with b.if_else(b.icmp_signed("==", stride, ir.Constant(I64, 1))) as (one, apart):
            with one:
                b.store(wv, b.bitcast(w0, vec(I32, n_words).as_pointer()), align=4)
            with apart:
                for w in range(n_words):
                    at = b.gep(w0, [b.mul(stride, ir.Constant(I64, w))])
                    b.store(b.extract_element(wv, ir.Constant(I32, w)), at, align=4)
        wide = b.sext(qv, vec(I32, n))
        sums = []
        for h in range(2):
            if 16 * h >= n:
                sums.append(ir.Constant(I32, 0))
                continue
            part = b.shuffle_vector(
                wide, wide, ir.Constant(vec(I32, 16), list(range(16 * h, 16 * h + 16)))
            )
            sums.append(call("llvm.vector.reduce.add.v16i32", I32, part))
        return context.make_tuple(b, sig.return_type, [amax, *sums])

    return ret(x, x_off, qmax, q, words, w_off, w_stride), codegen


# quantize_block(x, x_off, qmax, q, words, w_off, w_stride) -> (amax, s0, s1): one activation
# block of x (flat elements x_off .. x_off + n; n = 32 when q, which only gives the type, is
# int16, 16 when int8) rounded to q's type as floor(x * inv + 0.5) (a float32 multiply, then an
# add) clamped to +-qmax, inv = qmax / amax (0 for an all-zero block), amax = max |x|; its n / 2
# (int16) or n / 4 (int8) 4-byte words stored at words[w_off + i * w_stride]; s0 and s1 the int32
# sums of its first and second 16 values (s1 = 0 for int8)
quantize_block: Any = intrinsic(_quantize_block)

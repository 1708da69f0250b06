"""Exact integer dot products of one 16-row weight panel, by the best instructions the host has.

numba's own loops never emit VNNI (LLVM picks 256-bit vectors and plain multiplies), so the
integer sums of the quantized matmuls are LLVM x86 intrinsics called from a numba intrinsic:
`vpdpbusd` / `vpdpwssd` (AVX-512 VNNI, 512-bit; AVX-VNNI, 256-bit) or `vpmaddubsw` /
`vpmaddwd` (AVX2). AMX is never used (it is advertised on some hosts and traps there).

A panel holds 16 output rows interleaved: each 4-byte (int8 activations) or 2-byte (int16)
lane is one row's next weights, so one instruction against a broadcast group of activations
adds one row's partial sum to each int32 lane and no horizontal reduction is needed. The sums
are exact integers on every path, so which path ran never changes a result.

Layout of one group of 16 rows (`group_layout`: its bytes and the values of k it covers):
  8-bit weights (`il` = 4 for int8, 2 for int16 activations; 16 * il bytes): byte r * il + b
    is row r's weight k0 + b; with int16 activations as v - off in two's complement (every
    8-bit type has an offset and no minimum), sign-extended to words (vpmovsxbw where int8's
    vpdpbusd needs the unsigned v), so the sums hold the offset's part.
  4-bit weights, int8 activations (64 bytes, 8 values): byte r * 4 + b's low nibble is weight
    k0 + b, its high nibble weight k0 + 4 + b.
  4-bit weights, int16 activations (64 bytes, 8 values): row r's 4 bytes are two 16-bit
    words, the first holding weights k0, k0 + 2, k0 + 4, k0 + 6 in its nibbles (lowest
    first), the second k0 + 1, k0 + 3, k0 + 5, k0 + 7. Nibble p of both words, masked in
    place, is the pair (k0 + 2p, k0 + 2p + 1) times 16^p, which one vpdpwssd multiplies by
    the broadcast activation pair: no byte-to-word widening (a shuffle-port instruction per
    32 weights, which bounded the one-row kernel), and the sums of each p kept apart and
    shifted right by 4p at the end are the same exact integers.
  5-bit weights (Q5_0, Q5_1, Q5_K): their low four bits in the 4-bit layout of the mode, and
    the fifth bits in a plane of their own (`hb`, HIGH_BYTES per group): one bit per lane of
    each part the nibbles are unpacked into, in order (int8 activations: the low nibbles' 64
    bytes, then the high ones'; int16: nibble 0's 32 words, .. nibble 3's), bit i of the part
    its lane i. The bits become 16 (16^p scaled in place) added to the lanes they are set in, one
    masked add per part, before the same multiply-adds: 5/8 of an 8-bit panel's bytes read.
    In place, nibble 2 with its fifth bit is at most 31 * 256: an int16 activation block's 4
    groups add 8 products of at most 7936 * 32767 to a lane, 2,080,299,776 < 2^31.
    Q5_0 (offset 16, no minimum) with int16 activations: each part's nibble is or-ed with the
    bits above it, nibble - 16 in two's complement (an and and an or of constants are one
    vpternlog: no instruction more but for the last nibble's or), before the fifth bit's 16 is
    added, so the sums are of v - 16 (in place at most 16 * 256 in magnitude).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numba
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import NativeValue, intrinsic, models, register_model, unbox


class Isa(IntEnum):
    """The integer-dot-product paths, in order of preference."""

    PORTABLE = 0  # plain numba loops, any CPU
    AVX2 = 1  # vpmaddubsw / vpmaddwd, 256-bit
    AVX_VNNI = 2  # vpdpbusd / vpdpwssd, 256-bit (VEX)
    AVX512_VNNI = 3  # vpdpbusd / vpdpwssd, 512-bit


_NEEDS = {
    Isa.AVX2: {"avx2"},
    Isa.AVX_VNNI: {"avx2", "avxvnni"},
    Isa.AVX512_VNNI: {"avx512f", "avx512bw", "avx512vnni"},
}


def host_features() -> set[str]:
    """The CPU features LLVM compiles numba code for: the host's, or as numba is told.

    NUMBA_CPU_NAME names another CPU (`generic` for a portable cache): only the features
    NUMBA_CPU_FEATURES turns on. NUMBA_CPU_FEATURES alone ("+avx2,-avx512f,..."): the host's,
    each one it names turned on or off, so that `-avx512f,-avxvnni` compiles every kernel as
    for an AVX2-only CPU on any host (bench/isa.py).
    """
    name = numba.config.CPU_NAME  # type: ignore[attr-defined]
    told = numba.config.CPU_FEATURES  # type: ignore[attr-defined]
    on = set()
    if name in (None, "host"):
        on = {feature for feature, has in llvm.get_host_cpu_features().items() if has}
    return on if told is None else features_told(on, told)


def features_told(on: set[str], told: str) -> set[str]:
    """`on` with each feature of an LLVM feature string ("+avx2,-avx512f") turned on or off."""
    on = set(on)
    for item in filter(None, (part.strip() for part in told.split(","))):
        if item[0] == "-":
            on.discard(item[1:])
        else:
            on.add(item.removeprefix("+"))
    return on


_HOST = host_features()


def supported() -> list[Isa]:
    """Every path this host can run, portable first."""
    return [Isa.PORTABLE, *(isa for isa, need in _NEEDS.items() if need <= _HOST)]


SELECTED = max(supported())  # chosen once per process, from the host's features


# The kernels' `isa` argument is either an int, which their code compares at run time, so that
# one compiled kernel holds every path the host runs (the tests that loop over the paths pass
# ints), or a Path, whose numba type names one path, so that a kernel compiled for it emits that
# path alone: what a server runs (weights.isa_arg). A kernel holding AVX2, AVX-VNNI and AVX-512
# took three times as long to compile, and a cold start spent most of its minutes there
# (bench/README.md, "What a cold start compiles").
class PathType(types.Dummy):
    """numba's type of a Path: the path is in the type, the value carries nothing."""

    def __init__(self, isa: Isa) -> None:
        self.isa = Isa(isa)
        super().__init__(name=f"Path({self.isa.name})")

    def __reduce__(self) -> tuple[Any, ...]:  # (numba's cache index pickles signatures)
        return PathType, (int(self.isa),)


class Path:
    """One ISA path as an argument of the kernels (`path(isa)`)."""

    __slots__ = ("_numba_type_", "isa")

    def __init__(self, isa: Isa) -> None:
        self.isa = isa
        # numba's dispatcher reads the type from here in C: ~1 us a call, where a typeof_impl
        # (a call back into Python) cost ~8
        self._numba_type_ = PathType(isa)

    def __repr__(self) -> str:
        return f"path({self.isa.name})"


_PATHS = {isa: Path(isa) for isa in Isa}


def path(isa: Isa) -> Path:
    return _PATHS[Isa(isa)]


register_model(PathType)(models.OpaqueModel)


@unbox(PathType)  # type: ignore[no-untyped-call]
def _unbox_path(typ: PathType, obj: Any, c: Any) -> NativeValue:
    return NativeValue(c.context.get_dummy_value())  # type: ignore[no-untyped-call]


def paths_of(isa_type: Any) -> list[Isa] | None:
    """The paths a kernel emits for an `isa` argument of this numba type: the one a PathType
    names, or None for an integer (every path this host runs, compared at run time)."""
    if isinstance(isa_type, PathType):
        return [isa_type.isa]
    return None


def runs_portable(isa_type: Any) -> bool:
    """Whether a kernel compiled for an `isa` argument of this numba type can take the portable
    path: an integer, or a PathType naming it."""
    paths = paths_of(isa_type)
    return paths is None or Isa.PORTABLE in paths


def _isa_of(typingctx: Any, isa: Any) -> Any:
    if isinstance(isa, PathType):
        code = int(isa.isa)

        def constant(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            return ir.Constant(I64, code)

        return types.int64(isa), constant
    if isinstance(isa, types.Integer):

        def value(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
            return context.cast(builder, args[0], isa, types.int64)

        return types.int64(isa), value
    return None


# isa_of(isa) -> int64: the Isa value of a kernel's `isa` argument; a constant for a Path, so
# that LLVM drops the branches of every other path
isa_of: Any = intrinsic(_isa_of)


I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def as_i64(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An integer argument (an index, an offset, a count) as i64, sign-extended if narrower."""
    return b.sext(v, I64) if v.type.width < 64 else v


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _call(b: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return b.call(b.module.declare_intrinsic(name, fnty=fnty), list(args))


llvm.initialize_native_asmparser()  # for the inline assembly below


def _dpwssd(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value, disp: int = 0) -> ir.Value:
    """acc + the pairwise int16 products of w and the activation pair at x + disp bytes (x
    i8*) broadcast, as one vpdpwssd (512-bit) with its broadcast from memory:
    `vpdpwssd disp(x){1to16}`. The displacement is written into the instruction, so that the
    many multiply-adds of a sub-block share one base register: with each address its own
    operand LLVM computed every one with a lea (128 a sub-block of 8 rows, more than the rest
    of its instructions together).

    Inline assembly, because LLVM splits the intrinsic into vpmaddwd + vpaddd on the hosts it
    tunes for. The broadcast is part of the instruction: with the pair broadcast into a
    register first (a vbroadcastss per multiply-add) decode steps of 4, 16 and 64 sequences
    took 1.14x, 1.20x and 1.22x the time and a 512-token prefill 1.29x on Zen 4 (bench.ab
    --base 5f7e7f9, same bits). The activations are read through x without LLVM knowing:
    nothing in a kernel writes them."""
    ty = ir.FunctionType(acc.type, [acc.type, w.type, x.type])
    at = f"{disp}($3)" if disp else "($3)"
    return b.asm(ty, f"vpdpwssd {at}{{1to16}}, $2, $0", "=v,0,v,r", [acc, w, x], False)


def _maddwd_add(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """acc + the pairwise int16 products of w and x (AVX2: vpmaddwd, then vpaddd), as inline
    assembly: with the intrinsic and an add LLVM reassociated a row's adds into trees that
    held more sums at once than the 16 ymm have room for, and spilled them."""
    ret = ir.LiteralStructType([acc.type, acc.type])
    ty = ir.FunctionType(ret, [acc.type, w.type, x.type])
    asm = "vpmaddwd $4, $3, $1\n\tvpaddd $1, $0, $0"
    return b.extract_value(b.asm(ty, asm, "=x,=&x,0,x,x", [acc, w, x], False), 0)


# Quantized activations (n, K) are interleaved by 4-byte word in groups of ACT_ROWS rows, the
# last group holding the n % ACT_ROWS rest (kernels/panels.py's act_index): group g starts at
# element g * ACT_ROWS * K, and inside it word w (activations w * 4 / elem ..) of its row u is
# at byte (w * G + u) * 4, G the group's rows. The rows a kernel multiplies at once are then
# one pointer and constant offsets (eight row pointers spilled general registers, and each
# broadcast reloaded one), and a lone row (decode of one sequence) stays contiguous.
ACT_ROWS = 8


# bytes of a group's fifth bits (16 rows x 8 values)
HIGH_BYTES = 16


def group_layout(int16: bool, four_bit: bool, words: bool = False) -> tuple[int, int]:
    """(bytes, values of k) of one group of 16 rows' weights (the module's docstring; `words`:
    4- and 5-bit values unpacked to int16 words in the 8-bit layout, kernels/simd.py's
    unpack_words)."""
    if words:
        return 64, 2
    if four_bit:
        return 64, 8
    return (32, 2) if int16 else (64, 4)


def load_at(b: ir.IRBuilder, base: ir.Value, offset: ir.Value, ty: ir.Type) -> ir.Value:
    ptr = b.bitcast(b.gep(base, [offset]), ty.as_pointer())
    return b.load(ptr, align=1)


def _splat(b: ir.IRBuilder, x32: ir.Value, lanes: int, as_type: ir.Type) -> ir.Value:
    """An i32 (4 int8 or 2 int16 activations) repeated over `lanes` int32 lanes."""
    v = b.insert_element(ir.Constant(vec(I32, lanes), ir.Undefined), x32, ir.Constant(I32, 0))
    v = b.shuffle_vector(v, v, ir.Constant(vec(I32, lanes), [0] * lanes))
    return b.bitcast(v, as_type)


class Emitter:
    """Accumulates one panel's 16 int32 sums over a run of groups, for one ISA and mode."""

    def __init__(
        self, b: ir.IRBuilder, isa: Isa, int16: bool, four_bit: bool, chains: int = 1,
        planes: bool = False,
    ) -> None:  # fmt: skip
        self.b, self.isa, self.int16, self.four_bit = b, isa, int16, four_bit
        wide = isa == Isa.AVX512_VNNI
        # accumulators: one <16 x i32> (512-bit), two <8 x i32> halves, or (AVX2 with 8-bit
        # weights and int8 activations) four <8 x i32> of row pairs; `chains` copies of them,
        # so that consecutive pieces do not wait for each other's multiply-add (its latency,
        # not its throughput, bounded a single activation row). The copies are added at the
        # end: integer sums, so the same result.
        self.n_acc = 1 if wide else (4 if self._widened() else 2)
        # `planes` (4-bit weights, int16 activations): the nibbles are multiplied in place,
        # nibble p scaled by 16^p, each p into its own accumulators, shifted back at the end
        self.shifts = [0, 4, 8, 0] if planes else [0]
        self.chains = chains
        self.chain = 0  # the copy the next piece adds to
        self.plane = 0  # the nibble position of the next piece (planes only)
        width = 16 if wide else 8
        self.sets = [
            [
                [
                    cgutils.alloca_once_value(b, ir.Constant(vec(I32, width), None))  # type: ignore[no-untyped-call]
                    for _ in range(self.n_acc)
                ]
                for _ in range(chains)
            ]
            for _ in self.shifts
        ]

    @property
    def acc(self) -> list[ir.Value]:
        return self.sets[self.plane][self.chain]

    def _widened(self) -> bool:
        # vpmaddubsw sums two u8 * s8 products into a saturating int16: exact for 4-bit
        # weights, not for 8-bit ones up to 255
        return self.isa == Isa.AVX2 and not self.int16 and not self.four_bit

    def _add(self, i: int, v: ir.Value) -> None:
        self.b.store(self.b.add(self.b.load(self.acc[i]), v), self.acc[i])

    def piece(self, w: ir.Value, x: ir.Value, x_off: ir.Value | int) -> None:
        """Rows' next il weights (w: 16 * il bytes, or with int16 activations 32 words) times
        il activations (4 bytes at x_off of x: a value, or a constant)."""
        b, isa = self.b, self.isa
        if self.int16 and w.type == vec(I8, 32):
            w = b.sext(w, vec(I16, 32))  # 8-bit weights (v - off) widened to words
        if isa == Isa.AVX512_VNNI and self.int16:  # the pair broadcast from memory
            acc = b.load(self.acc[0])
            if isinstance(x_off, int):
                b.store(_dpwssd(b, acc, w, x, x_off), self.acc[0])
            else:
                b.store(_dpwssd(b, acc, w, b.gep(x, [x_off])), self.acc[0])
            return
        if isinstance(x_off, int):
            x_off = ir.Constant(I64, x_off)
        x32 = load_at(b, x, x_off, I32)
        if isa == Isa.AVX512_VNNI:
            r = _call(b, "llvm.x86.avx512.vpdpbusd.512", vec(I32, 16), b.load(self.acc[0]), w,
                      _splat(b, x32, 16, vec(I8, 64)))  # fmt: skip
            b.store(r, self.acc[0])
            return
        n = 32 if self.int16 else 64  # elements of w
        halves = [_part8(b, w, h * n // 2, n // 2) for h in range(2)]
        for h, half in enumerate(halves):  # rows 0..7, rows 8..15
            if self.int16:
                xv = _splat(b, x32, 8, vec(I16, 16))
                if isa == Isa.AVX_VNNI:
                    r = _call(b, "llvm.x86.avx512.vpdpwssd.256", vec(I32, 8), b.load(self.acc[h]), half, xv)  # fmt: skip
                    b.store(r, self.acc[h])
                else:
                    b.store(_maddwd_add(b, b.load(self.acc[h]), half, xv), self.acc[h])
            elif isa == Isa.AVX_VNNI:
                xv = _splat(b, x32, 8, vec(I8, 32))
                r = _call(b, "llvm.x86.avx512.vpdpbusd.256", vec(I32, 8), b.load(self.acc[h]), half, xv)  # fmt: skip
                b.store(r, self.acc[h])
            elif not self._widened():
                xv = _splat(b, x32, 8, vec(I8, 32))
                pairs = _call(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), half, xv)
                ones = ir.Constant(vec(I16, 16), [1] * 16)
                self._add(h, _call(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), pairs, ones))
            else:
                wide = b.zext(half, vec(I16, 32))
                x4 = b.bitcast(x32, vec(I8, 4))
                x16 = b.sext(x4, vec(I16, 4))
                xv = b.shuffle_vector(x16, x16, ir.Constant(vec(I32, 16), [0, 1, 2, 3] * 4))
                for q in range(2):  # rows 4q..4q+3 of this half, two int32 partials each
                    wq = b.shuffle_vector(
                        wide, wide, ir.Constant(vec(I32, 16), list(range(16 * q, 16 * q + 16)))
                    )
                    self._add(2 * h + q, _call(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), wq, xv))

    def reset(self) -> None:
        for chains in self.sets:
            for accs in chains:
                for a in accs:
                    self.b.store(ir.Constant(a.type.pointee, None), a)

    def sums(self) -> ir.Value:
        """The 16 rows' int32 sums as one <16 x i32>."""
        b = self.b
        p: list[ir.Value] = []
        for shift, chains in zip(self.shifts, self.sets, strict=True):
            q = [b.load(a) for a in chains[0]]
            for accs in chains[1:]:
                q = [b.add(x, b.load(a)) for x, a in zip(q, accs, strict=True)]
            if shift:  # exact: every product of this plane is a multiple of 16^p
                q = [b.ashr(x, ir.Constant(x.type, [shift] * x.type.count)) for x in q]
            p = q if not p else [b.add(x, y) for x, y in zip(p, q, strict=True)]
        if self.n_acc == 1:
            return p[0]
        if self.n_acc == 4:  # (row, partial) pairs -> rows
            even = ir.Constant(vec(I32, 8), list(range(0, 16, 2)))
            odd = ir.Constant(vec(I32, 8), list(range(1, 16, 2)))
            halves = [
                b.add(b.shuffle_vector(p[2 * h], p[2 * h + 1], even),
                      b.shuffle_vector(p[2 * h], p[2 * h + 1], odd))
                for h in range(2)
            ]  # fmt: skip
        else:
            halves = p
        return b.shuffle_vector(halves[0], halves[1], ir.Constant(vec(I32, 16), list(range(16))))


def _part8(b: ir.IRBuilder, w: ir.Value, start: int, n: int) -> ir.Value:
    return b.shuffle_vector(w, w, ir.Constant(vec(I32, n), list(range(start, start + n))))


# the kernels of few activation rows ask for the weights this many bytes ahead of the group
# being multiplied (one prefetch per cache line): a decode step of a few sequences reads every
# weight once, from DRAM, and the hardware's prefetchers alone left it at ~11 GB/s of ~20 on
# Ice Lake (bench.ab steps, as committed: decode B=1 0.83x best / 0.88x median the time, B=4
# 0.88x / 0.92x, B=16 1.00x, same bits; 1,024 bytes gave 0.91x at B=1). The kernels of a full
# row group (prefill, large batches) do without: with the prefetch in them too, a prefill of
# 64 rows took 1.05-1.09x the time; without, 1.03-1.06x, which may be noise.
PREFETCH_BYTES = 2048


def prefetch_line(b: ir.IRBuilder, p: ir.Value) -> None:
    """Ask for the cache line holding p (a read, kept in every cache level); a hint only,
    which never faults, even past the end of an array. The pointer goes as an i8*: one
    module (a fused layer inlines the matmuls and attention) declares the intrinsic once."""
    ptr = b.bitcast(p, ir.IntType(8).as_pointer())
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, I32, I32, I32])
    fn = b.module.declare_intrinsic("llvm.prefetch.p0", fnty=fnty)
    b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def prefetch(b: ir.IRBuilder, base: ir.Value, offset: int) -> None:
    """prefetch_line of the byte `offset` bytes after base."""
    prefetch_line(b, b.gep(base, [ir.Constant(I64, offset)]))


def with_high(
    b: ir.IRBuilder, part: ir.Value, hb: ir.Value, offset: int, value: int, masked: bool = False
) -> ir.Value:
    """part plus `value` in each lane whose bit is set in the mask at byte offset of hb.

    masked (AVX-512): one merge-masked vpaddb / vpaddw, as inline assembly, because LLVM
    turns the add of bits it knows are clear into an or, which has no byte or word masking,
    and then blends (two instructions per part, which slowed the one-row kernel by a third)."""
    n = part.type.count
    bits = load_at(b, hb, ir.Constant(I64, offset), ir.IntType(n))
    mask = b.bitcast(bits, vec(ir.IntType(1), n))
    add = ir.Constant(part.type, [value] * n)
    if not masked:
        return b.select(mask, b.add(part, add), part)
    op = "vpaddb" if part.type.element.width == 8 else "vpaddw"
    ty = ir.FunctionType(part.type, [part.type, part.type, mask.type])
    return b.asm(ty, op + " $2, $1, $0 {$3}", "=v,0,v,^Yk", [part, add, mask], False)


def _five_bit_bytes(b: ir.IRBuilder, lanes: ir.Value, hb: ir.Value) -> list[ir.Value]:
    """A group of 5-bit values in the 4-byte lanes of int8 activations (and exact mode), lanes
    (<16 x i32>) and their fifth bits at hb: [low nibbles, high nibbles] with the bits added,
    each <16 x i32> whose byte b of lane r is row r's value k0 + b, resp. k0 + 4 + b."""
    nibbles = ir.Constant(vec(I32, 16), [0x0F0F0F0F] * 16)
    out = []
    for q in range(2):
        nib = b.lshr(lanes, ir.Constant(vec(I32, 16), [4] * 16)) if q else lanes
        nib = b.bitcast(b.and_(nib, nibbles), vec(I8, 64))
        out.append(b.bitcast(with_high(b, nib, hb, 8 * q, 16), vec(I32, 16)))
    return out


def lane_values(
    b: ir.IRBuilder, lanes: ir.Value, four_bit: bool, hb: ir.Value | None = None
) -> list[tuple[int, ir.Value]]:
    """One group of 16 rows' values in the 4-byte lanes of int8 activations and exact mode
    (lanes <16 x i32>; 5-bit ones' fifth bits at hb): (k - k0, <16 x i32> of each row's value
    k) in the order bytes 0..3, each byte's low nibble before its high one (4- and 5-bit)."""

    def c(x: int) -> ir.Constant:
        return ir.Constant(vec(I32, 16), [x] * 16)

    if hb is not None:
        fives = _five_bit_bytes(b, lanes, hb)
        return [(4 * q + byte, b.and_(b.lshr(fives[q], c(8 * byte)), c(31)))
                for byte in range(4) for q in range(2)]  # fmt: skip
    mask = c(15 if four_bit else 255)
    out = []
    for byte in range(4):
        shifted = b.lshr(lanes, c(8 * byte))
        out.append((byte, b.and_(shifted, mask)))
        if four_bit:
            out.append((4 + byte, b.and_(b.lshr(shifted, c(4)), mask)))
    return out


def word_nibbles(
    b: ir.IRBuilder, wv: ir.Value, word: int, planes: bool, fold: bool
) -> tuple[list[tuple[ir.Value, int, int]], list[int]]:
    """A 4-bit int16 group's parts (value, activation word, plane) and what a set fifth bit
    adds to each: nibble p of every word, the pair (k0 + 2p, k0 + 2p + 1); in place (times
    16^p) with planes, else shifted down and masked (the many-row kernels share it); `fold`:
    each part's nibble - 16 (an or of the bits above it: two's complement)."""
    words = b.bitcast(wv, vec(I16, 32))
    parts, high = [], []
    for p in range(4):
        if p == 3:
            part = b.lshr(words, ir.Constant(vec(I16, 32), [12] * 32))
            high.append(16)
        elif planes:
            part = b.and_(words, ir.Constant(vec(I16, 32), [15 << 4 * p] * 32))
            high.append(16 << 4 * p)
        else:
            shifted = b.lshr(words, ir.Constant(vec(I16, 32), [4 * p] * 32)) if p else words
            part = b.and_(shifted, ir.Constant(vec(I16, 32), [15] * 32))
            high.append(16)
        if fold:  # nibble - 16 (times 16^p in place) as int16: -16 << 4p's bits or-ed in
            part = b.or_(part, ir.Constant(vec(I16, 32), [-high[-1]] * 32))
        parts.append((part, word + p, p))
    return parts, high


def accumulate_groups(
    b: ir.IRBuilder, rows: list[tuple[Emitter, ir.Value, int]], four_bit: bool, w: ir.Value,
    n_groups: int, stride: ir.Value, ahead: int = 0, hb: ir.Value | None = None,
    fold: bool = False, words: bool = False,
) -> None:  # fmt: skip
    """Add the panel rows' integer dot products over n_groups groups from w to each
    (accumulators, activations, byte offset of the row's first word from them) of `rows`
    (the activations' words `stride` bytes apart: ACT_ROWS' layout; a constant stride makes
    every offset a constant): one weight load and unpack for all of them; 5-bit weights with their
    fifth bits from hb (the module's docstring); `fold` (int16 activations, 5-bit values with an
    offset of 16): as v - 16, each nibble or-ed with the bits above it (nibble - 16 in two's
    complement, the same instruction count: an and and an or of constants are one vpternlog)
    before the fifth bit's 16 is added. `ahead` > 0: each cache line's load first
    asks for the one `ahead` bytes further (of hb's, as many groups ahead). `words`: w holds
    values already unpacked to int16 words (group_layout), multiplied as they are.
    Straight-line code (a sub-block's few groups), consecutive pieces on consecutive chains."""
    first = rows[0][0]
    const = isinstance(stride, ir.Constant)
    group_bytes, k_per_group = group_layout(first.int16, four_bit, words)
    elem = 2 if first.int16 else 1
    pieces = 0
    for g in range(n_groups):
        if ahead and (g * group_bytes) % 64 == 0:
            prefetch(b, w, g * group_bytes + ahead)
        if ahead and hb is not None and (g * HIGH_BYTES) % 64 == 0:
            prefetch(b, hb, (g * group_bytes + ahead) * HIGH_BYTES // group_bytes)
        at_g = ir.Constant(I64, g * group_bytes)
        wv = load_at(b, w, at_g, vec(I16, 32) if words else vec(I8, group_bytes))
        word = g * k_per_group * elem // 4  # the group's first word of activations
        high: list[int] = []  # per part: what a set fifth bit adds to its lanes
        if words:
            parts = [(wv, word, 0)]
        elif four_bit and first.int16:
            parts, high = word_nibbles(b, wv, word, len(first.shifts) > 1, fold)
        elif four_bit:
            mask = ir.Constant(vec(I8, group_bytes), [15] * group_bytes)
            shift = ir.Constant(vec(I8, group_bytes), [4] * group_bytes)
            parts = [(b.and_(wv, mask), word, 0), (b.lshr(wv, shift), word + 1, 0)]
            high = [16, 16]
        else:
            parts = [(wv, word, 0)]
        if hb is not None:
            at = g * HIGH_BYTES
            for i, (part, x_word, plane) in enumerate(parts):
                wide = first.isa == Isa.AVX512_VNNI
                parts[i] = (with_high(b, part, hb, at, high[i], wide), x_word, plane)
                at += part.type.count // 8
        for part, x_word, plane in parts:
            x_off = None if const else b.mul(stride, ir.Constant(I64, x_word))
            for em, x, row_off in rows:
                em.chain = pieces % em.chains
                em.plane = plane if len(em.shifts) > 1 else 0
                if x_off is None:
                    em.piece(part, x, stride.constant * x_word + row_off)
                else:
                    em.piece(part, x, b.add(x_off, ir.Constant(I64, row_off)) if row_off else x_off)
            pieces += 1

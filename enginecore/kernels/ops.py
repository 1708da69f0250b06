"""Elementwise and per-row operations of the decoder block, over preallocated fp32 arrays.

A few-row step's rows are too small to pay for waking a second thread, so the plain kernels
are single-threaded; the `*_parallel` ones split the rows of a many-row (BLAS-mode) step over
numba's threads, which are free there when BLAS runs on them too (kernels/gemm.py). One row's
work is one inlined function, shared by both.

The float kernels take FAST, every LLVM fast-math flag but reassociation, and write each sum's
order out (lane_sum): with reassociation LLVM picks a sum's order as it vectorizes, and two
compiles of one source need not pick alike. They did not: paged_attention compiled in a
process (which runs its parallel body's own compile) and the same kernel loaded from numba's
cache (which runs the copy linked into its module) differed by an ulp on a Q4_K_M prefill, so
a server's first start and its later ones answered differently.
"""

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from enginecore.kernels.dot import I32, I64, load_at, vec

# numba's fast-math flags for the float kernels: all but "reassoc" (above)
FAST = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}
_FLAGS = sorted(FAST)  # the same, on the LLVM instructions of an intrinsic


@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret an int32 as float32 (an LLVM bitcast, which vectorizes)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def fast_exp(x):
    """float32 exp within ~2 ulp (Cephes expf); unlike libm's it vectorizes. Clamped to +-87."""
    x = min(max(x, np.float32(-87.0)), np.float32(87.0))
    k = np.floor(x * np.float32(1.442695041) + np.float32(0.5))
    r = x - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    bits = np.int32((np.int32(k) + np.int32(127)) << np.int32(23))  # 2^k as float32 bits
    return p * _f32_from_bits(bits)  # type: ignore[call-arg]


@njit(cache=True, nogil=True, inline="always")
def _term(v, square):
    return v * v if square else v


def _lanes8(kind: str) -> Any:
    # lanes8_<kind>(row) -> 8 float32: lane j over row[j::8] of row's whole groups of eight (a
    # C-contiguous float32 row), in order: the sum ("sum"), the sum of squares ("sumsq") or
    # the largest value, -1e30 at least ("max", a > b ? a : b). One <8 x float> operation per
    # group: written as eight scalar chains, LLVM kept them scalar (vaddss, vmaxss: 0.23 and
    # 0.33 ns a value on the Emerald Rapids host, 0.56 of a softmax row's ~1.4 ns a score), and
    # a vector of lanes does each chain's operations in the same order, so the same bits.
    def typer(typingctx: Any, row: Any) -> Any:
        if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C"):
            return None
        if row.dtype != types.float32:
            return None
        ret = types.UniTuple(types.float32, 8)  # type: ignore[no-untyped-call]

        def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
            f8 = vec(ir.FloatType(), 8)
            arr = context.make_array(sig.args[0])(context, b, args[0])
            groups = b.sdiv(b.extract_value(arr.shape, 0), ir.Constant(I64, 8))
            first = ir.Constant(f8, [-1e30 if kind == "max" else 0.0] * 8)
            acc = cgutils.alloca_once_value(b, first)  # type: ignore[no-untyped-call]
            with cgutils.for_range(b, groups) as loop:
                x = load_at(b, arr.data, b.mul(loop.index, ir.Constant(I64, 8)), f8)
                a = b.load(acc)
                if kind == "max":
                    b.store(b.select(b.fcmp_ordered(">", a, x, flags=_FLAGS), a, x), acc)
                else:
                    x = b.fmul(x, x, flags=_FLAGS) if kind == "sumsq" else x
                    b.store(b.fadd(a, x, flags=_FLAGS), acc)
            lanes = b.load(acc)
            out = [b.extract_element(lanes, ir.Constant(I32, j)) for j in range(8)]
            return context.make_tuple(b, ret, out)

        return ret(row), codegen

    return intrinsic(typer)


lanes8_sum, lanes8_sumsq, lanes8_max = _lanes8("sum"), _lanes8("sumsq"), _lanes8("max")


@njit(cache=True, nogil=True, inline="always")
def lane_sum(row, square):
    """sum(row), or sum(row ** 2) when square, in an order fixed here: eight partial sums, the
    j-th over row[j::8] of the whole groups of eight (lanes8_sum / _sumsq), added pairwise,
    then the tail in turn; any compile of it gives the same bits."""
    if square:
        s0, s1, s2, s3, s4, s5, s6, s7 = lanes8_sumsq(row)
    else:
        s0, s1, s2, s3, s4, s5, s6, s7 = lanes8_sum(row)
    s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    end = row.shape[0] // 8 * 8
    for p in range(end, row.shape[0]):
        s += _term(row[p], square)
    return s


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def rmsnorm(x, w, eps, out):  # x (n, d), w (d,) -> out (n, d)
    n, dim = x.shape
    for t in range(n):
        ss = lane_sum(x[t], True)
        scale = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for i in range(dim):
            out[t, i] = x[t, i] * scale * w[i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def head_rmsnorm(x, col0, n_heads, head_dim, w, eps):
    # in place: each of the n_heads head_dim-wide pieces of x[:, col0:] normed, times w (head_dim,)
    for t in range(x.shape[0]):
        for h in range(n_heads):
            base = col0 + h * head_dim
            ss = lane_sum(x[t, base : base + head_dim], True)
            scale = np.float32(1.0) / np.sqrt(ss / np.float32(head_dim) + np.float32(eps))
            for i in range(head_dim):
                x[t, base + i] = x[t, base + i] * scale * w[i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _add_rmsnorm_row(x, y, w, eps, out, t):
    dim = x.shape[1]
    for i in range(dim):
        x[t, i] += y[t, i]
    ss = lane_sum(x[t], True)
    scale = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
    for i in range(dim):
        out[t, i] = x[t, i] * scale * w[i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def add_rmsnorm(x, y, w, eps, out):  # x (n, d) += y (n, d); out (n, d) = rmsnorm(x) * w
    for t in range(x.shape[0]):
        _add_rmsnorm_row(x, y, w, eps, out, t)


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def add_rmsnorm_parallel(x, y, w, eps, out):
    for t in prange(x.shape[0]):
        _add_rmsnorm_row(x, y, w, eps, out, t)


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _rope_row(x, t, p, cos, sin, n_heads, head_dim):
    half = head_dim // 2
    for h in range(n_heads):
        base = h * head_dim
        for i in range(half):
            a = x[t, base + i]
            b = x[t, base + half + i]
            x[t, base + i] = a * cos[p, i] - b * sin[p, i]
            x[t, base + half + i] = b * cos[p, i] + a * sin[p, i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def rope(x, positions, cos, sin, n_heads, head_dim):
    # x (n, >= n_heads * head_dim) rotated in place, rotate-half (NeoX/HF) layout;
    # positions (n,) int32; cos, sin (max_pos, head_dim // 2)
    for t in range(x.shape[0]):
        _rope_row(x, t, positions[t], cos, sin, n_heads, head_dim)


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def rope_parallel(x, positions, cos, sin, n_heads, head_dim):
    for t in prange(x.shape[0]):
        _rope_row(x, t, positions[t], cos, sin, n_heads, head_dim)


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _silu_mul_row(gate_up, out, t):
    f = out.shape[1]
    for i in range(f):
        g = gate_up[t, i]
        out[t, i] = g / (np.float32(1.0) + fast_exp(-g)) * gate_up[t, f + i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def silu_mul(gate_up, out):  # gate_up (n, 2 * f) = [gate | up] -> out (n, f) = silu(gate) * up
    for t in range(gate_up.shape[0]):
        _silu_mul_row(gate_up, out, t)


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def silu_mul_parallel(gate_up, out):
    for t in prange(gate_up.shape[0]):
        _silu_mul_row(gate_up, out, t)


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def _gelu_mul_row(gate_up, out, t):
    # GELU in its tanh form (Gemma's gelu_pytorch_tanh)
    f = out.shape[1]
    for i in range(f):
        g = gate_up[t, i]
        inner = np.float32(0.7978845608028654) * (g + np.float32(0.044715) * g * g * g)
        out[t, i] = np.float32(0.5) * g * (np.float32(1.0) + np.tanh(inner)) * gate_up[t, f + i]


@njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def gelu_mul(gate_up, out):  # gate_up (n, 2 * f) = [gate | up] -> out (n, f) = gelu(gate) * up
    for t in range(gate_up.shape[0]):
        _gelu_mul_row(gate_up, out, t)


@njit(parallel=True, cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def gelu_mul_parallel(gate_up, out):
    for t in prange(gate_up.shape[0]):
        _gelu_mul_row(gate_up, out, t)


@njit(cache=True, nogil=True)
def add_inplace(x, y):  # x (n, d) += y (n, d)
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[t, i] += y[t, i]

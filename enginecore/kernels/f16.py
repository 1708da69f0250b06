"""fp16 <-> fp32 inside numba code, on uint16 bit patterns (numba has no float16 arithmetic).

LLVM lowers these to F16C's vcvtph2ps / vcvtps2ph (round to nearest even, as numpy's
astype(np.float16)), and they vectorize.
"""

from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _f16_bits_to_f32(typingctx, bits):
    """float32 of fp16 bits."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


def _kv_load(typingctx, value):
    """A KV cache element as float32: itself (f32 cache) or its fp16 bits widened."""
    if value == types.float32:
        return types.float32(value), lambda context, builder, sig, args: args[0]
    if value == types.uint16:

        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

        return types.float32(value), codegen
    return None


def _kv_store(typingctx, x, like):
    """float32 x as a KV cache element of like's type (float32, or fp16 bits in a uint16)."""
    if x != types.float32 or like not in (types.float32, types.uint16):
        return None
    if like == types.float32:
        return types.float32(x, like), lambda context, builder, sig, args: args[0]

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(x, like), codegen


# numba intrinsics, typed per call site: Any to the type checker
f16_bits_to_f32: Any = intrinsic(_f16_bits_to_f32)
kv_load: Any = intrinsic(_kv_load)
kv_store: Any = intrinsic(_kv_store)

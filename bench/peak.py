"""The rate this host can do int16 multiply-adds at on the path the kernels select: a yardstick
for the compute-bound figures (many-row decode steps, prefill), as DRAM bandwidth is for a
one-row step.

`python -m bench.peak` prints G multiply-adds per second of a loop made only of the
instructions the int16 kernels multiply with, on registers (no loads but the broadcast operand
AVX-512's kernels read from memory too), on one thread and on every numba thread at once:
- AVX2: `vpmaddwd` + `vpaddd` pairs (kernels/dot.py's `_maddwd_add`), 16 products a pair;
- AVX-VNNI: `{vex} vpdpwssd` on ymm, 16 a one;
- AVX-512 VNNI: `vpdpwssd` with a `{1to16}` broadcast from memory (`_dpwssd`), 32 a one.
Twelve (AVX2: six) independent accumulators, so the loop is bound by the ports, not by any
one chain's latency. What the kernels add to it (loads, the float work per sub-block, the
activations' quantization) is theirs to lose: the loop is the ceiling, not a target. All
threads against one tells whether the vCPUs share a core's ports (twice the rate: they do
not). The portable path has no such loop.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from enginecore.kernels import dot, threads

I32, I64 = ir.IntType(32), ir.IntType(64)


def _body(isa: dot.Isa) -> tuple[str, int, str]:
    """(assembly of one iteration's multiply-adds, products per iteration, register class)."""
    if isa == dot.Isa.AVX2:
        pairs = [f"vpmaddwd %ymm14, %ymm15, %ymm{6 + i}\n\tvpaddd %ymm{6 + i}, %ymm{i}, %ymm{i}"
                 for i in range(6)]  # fmt: skip
        return "\n\t".join(pairs), 6 * 16, "ymm"
    if isa == dot.Isa.AVX_VNNI:
        ops = [f"{{vex}} vpdpwssd %ymm14, %ymm15, %ymm{i}" for i in range(12)]
        return "\n\t".join(ops), 12 * 16, "ymm"
    if isa == dot.Isa.AVX512_VNNI:
        ops = [f"vpdpwssd ($3){{1to16}}, %zmm15, %zmm{i}" for i in range(12)]
        return "\n\t".join(ops), 12 * 32, "zmm"
    raise ValueError(f"no multiply-add loop for the {isa.name} path")


def _setup(reg: str) -> str:
    """Every int16 of ymm14 / zmm15 one, the accumulators zero."""
    if reg == "zmm":
        ones = "vpternlogd $$0xff, %zmm15, %zmm15, %zmm15\n\tvpsrlw $$15, %zmm15, %zmm15"
        zero = [f"vpxord %zmm{i}, %zmm{i}, %zmm{i}" for i in range(12)]
    else:
        ones = ("vpcmpeqw %ymm15, %ymm15, %ymm15\n\tvpsrlw $$15, %ymm15, %ymm15\n\t"
                "vmovdqa %ymm15, %ymm14")  # fmt: skip
        zero = [f"vpxor %ymm{i}, %ymm{i}, %ymm{i}" for i in range(12)]
    return ones + "\n\t" + "\n\t".join(zero)


def products_per_iteration(isa: dot.Isa) -> int:
    return _body(isa)[1]


def _spin(typingctx: Any, n: Any) -> Any:
    """spin(n): n iterations of the path's multiply-add loop; returns the first accumulator's
    first int32 lane (every product is 1 * 1: 2 a vpmaddwd / vpdpwssd, so 2 * n * the ones on
    that accumulator per iteration; the test checks it)."""
    if n != types.int64:
        return None

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> Any:
        body, _, reg = _body(dot.SELECTED)
        asm = f"{_setup(reg)}\n1:\n\t{body}\n\tdec $0\n\tjnz 1b\n\tvmovd %xmm0, $1"
        clobbers = ",".join(f"~{{{reg}{i}}}" for i in range(16))
        pair = ir.Constant(I32, 0x00010001)  # two int16 ones: AVX-512's broadcast operand
        const = cgutils.global_constant(builder.module, "peak_pair", pair)
        ret = ir.LiteralStructType([I64, I32])
        fnty = ir.FunctionType(ret, [I64, const.type])
        out = builder.asm(
            fnty, asm, f"=r,=r,0,r,{clobbers},~{{dirflag}},~{{fpsr}},~{{flags}}",
            [args[0], const], True,
        )  # fmt: skip
        return builder.extract_value(out, 1)

    return types.int32(types.int64), codegen


spin: Any = intrinsic(_spin)


@njit(nogil=True)
def _one(n):
    return spin(n)


@njit(parallel=True, nogil=True)
def _all(n, workers):
    out = 0
    for _ in prange(workers):
        out += spin(n)
    return out


def rate(workers: int, seconds: float = 0.2, repeat: int = 5) -> float:
    """Best of `repeat` runs, G multiply-adds per second summed over `workers` threads."""
    per = products_per_iteration(dot.SELECTED)
    _one(1000)
    _all(1000, workers)
    n = 1 << 16
    t = time.perf_counter()
    _one(n)
    n = max(int(n * seconds / max(time.perf_counter() - t, 1e-6)), 1000)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        if workers == 1:
            _one(n)
        else:
            _all(n, workers)
        best = min(best, time.perf_counter() - t)
    return workers * n * per / best / 1e9


def peak() -> tuple[str, float | None]:
    """This path's loop on one and on every thread: a line for the measuring tools, and the
    rate on every thread (None on the portable path)."""
    if dot.SELECTED == dot.Isa.PORTABLE:
        return "int16 multiply-add peak: none on the portable path", None
    workers = threads.count()
    one, every = rate(1), rate(workers)
    line = (
        f"int16 multiply-add peak ({dot.SELECTED.name}, a register loop, bench/peak.py): "
        f"{one:.1f} G MAC/s on 1 thread, {every:.1f} on {workers} ({every / one:.2f}x)"
    )
    return line, every


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(peak()[0])


if __name__ == "__main__":
    main()

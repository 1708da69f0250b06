"""Measure on this host as on an older CPU: the LLVM feature string that compiles both sides for it.

    export NUMBA_CPU_FEATURES=$(.venv/bin/python -m bench.isa avx2) OPENBLAS_CORETYPE=Haswell
    flock /tmp/tl-heavy.lock .venv/bin/python -m bench.llamacpp build   # the AVX2-only llama.cpp

This machine kind lands on AMD Zen 3 (AVX2 and nothing newer) as well as on AVX-512 VNNI hosts.
On an AVX-512 host, `avx2` is the host's LLVM features with every extension a Zen 3 lacks that
the kernels or ggml could use turned off (AVX-512 and AVX10, AVX-VNNI, AMX). With it in
NUMBA_CPU_FEATURES, numba compiles tl-serve's every kernel for that CPU (kernels/dot.py then
selects the AVX2 path, attention the 256-bit one), and bench.llamacpp builds and finds the
llama.cpp whose options those same features give (the `avx2` build): a proxy of a Zen 3 on
this host's memory and clocks, not a Zen 3's figures. Unset, both are the host's own.

numpy's OpenBLAS chooses its kernels when it loads, from the CPU, not from numba's features:
a prefill's attention calls its sgemm (kernels/gemm.py), which would run AVX-512 code in an
AVX2 measurement. OPENBLAS_CORETYPE=Haswell (its AVX2 kernels, the ones it runs on a Zen 3)
makes it run as such a CPU; the bench tools that measure refuse to run an AVX2 proxy without
it (`blas_as_told`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from llvmlite import binding as llvm

# LLVM feature names (prefixes) a Zen 3 does not have and a kernel could use
NEWER_THAN_AVX2 = ("avx512", "avx10", "avxvnni", "avxifma", "avxneconvert", "amx", "evex512")
CEILINGS = ("avx2",)
# OPENBLAS_CORETYPE for each ceiling: OpenBLAS's name of the CPU whose kernels it then runs
BLAS_CORE = {"avx2": "Haswell"}


def ceiling_features(host: dict[str, bool], ceiling: str) -> str:
    """The host's LLVM feature string ("+avx2,-avx512f,...") with what is newer than `ceiling` off."""
    if ceiling not in CEILINGS:
        raise ValueError(f"unknown ceiling {ceiling!r}; choose from {', '.join(CEILINGS)}")
    if not host.get("avx2"):
        raise ValueError("this host has no AVX2: it cannot run as an AVX2 CPU")
    on = {name: has and not name.startswith(NEWER_THAN_AVX2) for name, has in host.items()}
    return ",".join(("+" if has else "-") + name for name, has in sorted(on.items()))


def blas_as_told(environ: Mapping[str, str] = os.environ) -> None:
    """Exit with a message when NUMBA_CPU_FEATURES compiles the kernels without AVX-512 but
    OPENBLAS_CORETYPE does not tell numpy's OpenBLAS to leave it too (the module's docstring)."""
    told = {item.strip() for item in environ.get("NUMBA_CPU_FEATURES", "").split(",")}
    if "-avx512f" in told and not environ.get("OPENBLAS_CORETYPE"):
        raise SystemExit(
            "NUMBA_CPU_FEATURES compiles tl-serve's kernels without AVX-512, but numpy's "
            "OpenBLAS would still run its AVX-512 kernels (a prefill's attention): "
            f"export OPENBLAS_CORETYPE={BLAS_CORE['avx2']} too (bench/isa.py)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.isa", description=__doc__.split("\n")[0])
    p.add_argument("ceiling", choices=CEILINGS)
    args = p.parse_args(argv)
    print(ceiling_features(dict(llvm.get_host_cpu_features()), args.ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())

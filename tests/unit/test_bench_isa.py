"""bench/isa.py: measuring on an AVX-512 host as on an AVX2-only one, both servers alike."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from llvmlite import binding as llvm

from bench.isa import BLAS_CORE, blas_as_told, ceiling_features
from bench.llamacpp import isa_options, isa_tag, told_flags
from enginecore.kernels import dot, gemm

HOST = {"avx2": True, "fma": True, "avx512f": True, "avx512vnni": True, "avxvnni": True,
        "amx-int8": True, "avx10.1": False, "sse4.2": True}  # fmt: skip
CPUINFO = {"sse4_2", "avx", "f16c", "fma", "bmi2", "avx2", "avx512f", "avx512cd", "avx512vl",
           "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni", "avx_vnni", "avx512_bf16"}  # fmt: skip


def test_the_avx2_ceiling_turns_off_everything_newer_and_keeps_the_rest() -> None:
    told = ceiling_features(HOST, "avx2")
    assert told == "-amx-int8,-avx10.1,+avx2,-avx512f,-avx512vnni,-avxvnni,+fma,+sse4.2"
    assert dot.features_told({k for k, v in HOST.items() if v}, told) == {"avx2", "fma", "sse4.2"}
    with pytest.raises(ValueError, match="no AVX2"):
        ceiling_features({"avx2": False, "sse4.2": True}, "avx2")
    with pytest.raises(ValueError, match="unknown ceiling"):
        ceiling_features(HOST, "avx")


def test_the_anchor_is_built_for_the_features_tl_serve_compiles_for() -> None:
    assert isa_tag(isa_options(told_flags(CPUINFO, None))) == "avx2-avx512-vbmi-vnni-avxvnni-bf16"
    told = ceiling_features(dict.fromkeys(["avx2", "fma", "avx512f", "avx512vbmi", "avx512vnni",
                                           "avxvnni", "avx512bf16", "avx512bw"], True), "avx2")  # fmt: skip
    assert isa_tag(isa_options(told_flags(CPUINFO, told))) == "avx2"
    # VNNI alone off: AVX-512 stays, as the kernels' own choice would (dot._NEEDS)
    assert (
        isa_tag(isa_options(told_flags(CPUINFO, "-avx512vnni"))) == "avx2-avx512-vbmi-avxvnni-bf16"
    )


@pytest.mark.skipif(dot.Isa.AVX2 not in dot.supported(), reason="this host has no AVX2")
def test_a_process_told_it_is_an_avx2_cpu_runs_the_avx2_paths() -> None:
    told = ceiling_features(dict(llvm.get_host_cpu_features()), "avx2")
    code = (
        "import numba; from enginecore.kernels import attention_simd, dot, gemm; "
        "print(dot.SELECTED.name, attention_simd.QK_HEADS, numba.config.CPU_FEATURES.count('+avx512'), "
        "gemm.openblas_core() or '-')"
    )
    # and numpy's OpenBLAS (a prefill's attention) told its kernels by the variable bench/isa.py
    # asks for beside
    env = dict(os.environ, NUMBA_CPU_FEATURES=told, OPENBLAS_CORETYPE=BLAS_CORE["avx2"])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "3", "0", "Haswell" if gemm.AVAILABLE else "-"]


def test_an_avx2_measurement_needs_openblas_told_too() -> None:
    told = "+avx2,-avx512f,-avx512vnni"
    with pytest.raises(SystemExit, match="OPENBLAS_CORETYPE=Haswell"):
        blas_as_told({"NUMBA_CPU_FEATURES": told})
    blas_as_told({"NUMBA_CPU_FEATURES": told, "OPENBLAS_CORETYPE": "Haswell"})
    blas_as_told({})  # the host's own
    blas_as_told({"NUMBA_CPU_FEATURES": "-avx512vnni"})  # AVX-512 kept

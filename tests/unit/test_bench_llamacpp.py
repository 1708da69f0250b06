"""bench.llamacpp's pure parts: which CMake options a CPU gets, the build folder's tag, the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.llamacpp import NEVER, cmake_configure, cpu_flags, isa_options, isa_tag

SAPPHIRE_RAPIDS = (
    "fpu sse4_2 avx f16c fma bmi2 avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi "
    "avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
)
ZEN3 = "fpu sse4_2 avx f16c fma bmi2 avx2"


def options(flags: str) -> dict[str, bool]:
    return isa_options(set(flags.split()))


def test_cpu_flags_reads_the_first_flags_line() -> None:
    text = (
        "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(text) == {"fpu", "avx2"}
    assert cpu_flags("processor\t: 0\n") == set()


def test_every_extension_the_host_has_is_on_and_amx_is_off() -> None:
    on = options(SAPPHIRE_RAPIDS)
    assert all(on[k] for k in on if k not in NEVER)
    assert not any(on[k] for k in NEVER)
    assert isa_tag(on) == "avx2-avx512-vbmi-vnni-avxvnni-bf16"


def test_an_avx2_host_gets_no_avx512() -> None:
    on = options(ZEN3)
    assert on["GGML_AVX2"] and on["GGML_FMA"] and on["GGML_F16C"]
    assert not on["GGML_AVX512"] and not on["GGML_AVX_VNNI"]
    assert isa_tag(on) == "avx2"
    assert isa_tag(options("fpu sse2")) == "generic"


def test_avx512_needs_all_five_base_extensions_and_its_extensions_need_it() -> None:
    # -mavx512f/cd/vl/dq/bw are compiled in together; VNNI without them would be a trap
    partial = options(ZEN3 + " avx512f avx512cd avx512_vnni avx512_bf16 avx_vnni")
    assert not partial["GGML_AVX512"]
    assert not partial["GGML_AVX512_VNNI"] and not partial["GGML_AVX512_BF16"]
    assert partial["GGML_AVX_VNNI"]  # the VEX-encoded one stands alone
    assert isa_tag(partial) == "avx2-avxvnni"


@pytest.mark.parametrize("flags", [SAPPHIRE_RAPIDS, ZEN3])
def test_configure_turns_native_off_and_sets_every_option_explicitly(flags: str) -> None:
    on = options(flags)
    argv = cmake_configure(Path("/src"), Path("/build"), on)
    defs = dict(a[2:].split("=", 1) for a in argv if a.startswith("-D"))
    assert defs["GGML_NATIVE"] == "OFF"
    assert defs["CMAKE_BUILD_TYPE"] == "Release"
    assert defs["BUILD_SHARED_LIBS"] == "ON"
    assert defs["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert {k: defs[k] == "ON" for k in on} == on
    assert argv[:5] == ["cmake", "-S", "/src", "-B", "/build"]

"""Every GGUF type: decoded bit-exact against gguf.quants.dequantize, and every panel kernel
on every ISA path this host runs equal to the portable path bit for bit and to float64."""

from __future__ import annotations

import pickle
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest

from enginecore import loader, weights
from enginecore.kernels import dot, panels, simd, threads
from enginecore.loader import gguf_types
from enginecore.weights import Numerics, PackedMatrix
from tests.conftest import TinyModels
from tests.fixtures.quant_blocks import FP16_FIELDS, random_blocks

Q = gguf.GGMLQuantizationType
TYPES = sorted(FP16_FIELDS, key=lambda t: t.name)
RNG = np.random.default_rng(11)
FIVE_BIT = {Q.Q5_0, Q.Q5_1, Q.Q5_K}
ROWS, COLS = 37, 512  # a part-filled last panel; two K-quant super-blocks
LONG_COLS = 1024  # rows longer than kernels/panels.py's WORDS_SHORT_K


def blocks(qtype: Q, rows: int = ROWS, cols: int = COLS) -> tuple[np.ndarray, np.ndarray]:
    raw = random_blocks(qtype, rows, cols, RNG)
    return raw, gguf.quants.dequantize(raw, qtype).astype(np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_every_type_of_the_issue_is_decoded() -> None:
    assert set(gguf_types.DECODERS) == set(FP16_FIELDS)
    assert {t.name for t in TYPES} >= {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
                                       "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}  # fmt: skip


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decoding_is_bit_exact_against_gguf(qtype: Q) -> None:
    raw, want = blocks(qtype)
    dec = gguf_types.decode(qtype, raw)
    assert int(dec.v.max()) < 2**dec.bits and (dec.bits == 5) == (qtype in FIVE_BIT)
    np.testing.assert_array_equal(bits(gguf_types.dequantize(dec)), bits(want))


@pytest.mark.parametrize("numerics", list(Numerics))
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_embedding_lookup_dequantizes_the_rows_bit_exact(qtype: Q, numerics: Numerics) -> None:
    raw, want = blocks(qtype)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), numerics)
    ids = np.array([36, 0, 17, 17, 5], np.int32)
    out = np.empty((ids.size, COLS), np.float32)
    m.gather(ids, out)
    np.testing.assert_array_equal(bits(out), bits(want[ids]))


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    assert np.abs(got - want).max() <= rel * np.abs(want).max()


@pytest.mark.parametrize("n", [1, 3, weights.EXACT_STREAM_MAX_ROWS + 5])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_exact_mode_equals_float64_on_both_paths(qtype: Q, n: int) -> None:
    raw, w = blocks(qtype)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), Numerics.EXACT)
    x = RNG.standard_normal((n, COLS)).astype(np.float32)
    out = np.full((n, ROWS + 7), np.nan, np.float32)
    m.matmul(x, out, 3)  # columns 3.. of a wider output, as a part of a fused matrix
    close(out[:, 3 : 3 + ROWS], reference(x, w), 2e-6)
    assert np.isnan(out[:, :3]).all() and np.isnan(out[:, 3 + ROWS :]).all()


# activations per scale: int8 per 16, int16 per 32
BLOCK = {Numerics.INT8: 16, Numerics.INT16: 32}


def act_rows(a: weights.Activations) -> np.ndarray:
    """a.xq with its rows in order: the kernels' interleaving (kernels/dot.py's ACT_ROWS)
    undone."""
    n, k = a.xq.shape
    e, flat, out = 4 // a.xq.itemsize, a.xq.reshape(-1), np.empty_like(a.xq)
    for t in range(n):
        g, u = divmod(t, dot.ACT_ROWS)
        rows = min(dot.ACT_ROWS, n - g * dot.ACT_ROWS)
        start = g * dot.ACT_ROWS * k
        group = flat[start : start + rows * k].reshape(k // e, rows, e)
        out[t] = group[:, u].reshape(-1)
    return out


def quantized_reference(x: np.ndarray, w: np.ndarray, numerics: Numerics) -> np.ndarray:
    """x rounded per block as the kernels do, times w, in float64."""
    a = weights.quantize(x, numerics)
    xr = act_rows(a).astype(np.float64) * np.repeat(
        a.xa.T.astype(np.float64), BLOCK[numerics], axis=1
    )
    return xr @ w.astype(np.float64).T


INTEGER = [Numerics.INT8, Numerics.INT16]


@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_integer_paths_equal_portable_bit_for_bit(
    qtype: Q, numerics: Numerics, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, w = blocks(qtype)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), numerics)
    n = simd.DOUBLE + simd.WIDE + simd.ROWS + 1  # a block of each row count the kernels take
    x = RNG.standard_normal((n, COLS)).astype(np.float32) * 3
    outs = {}
    # every path from one kernel compiled with all of them (an int), then the selected one from
    # kernels compiled with it alone (a dot.Path), as a server runs it, and the portable one as
    # a Path too (a host without AVX2: panels.portable_row's loop, which the SIMD paths' Path
    # kernels leave out); the quantized activations made once (the int kernel is then
    # int_matmul's alone, not also the one that quantizes in its parallel region: each costs a
    # minute or two of a cold CI run)
    acts = weights.quantize(x, numerics)
    for isa in [*map(int, dot.supported()), dot.SELECTED, dot.Isa.PORTABLE]:
        monkeypatch.setattr(weights, "ISA", isa)
        outs[isa, type(isa)] = np.full((n, ROWS), np.nan, np.float32)
        m.matmul(x, outs[isa, type(isa)], acts=acts)
    # and quantized inside the kernel's parallel region, as a server's first matmul of an input
    outs[dot.SELECTED, "quantizing"] = np.full((n, ROWS), np.nan, np.float32)
    m.matmul(x, outs[dot.SELECTED, "quantizing"])
    portable = outs[dot.Isa.PORTABLE, int]
    for (isa, kind), out in outs.items():
        np.testing.assert_array_equal(bits(out), bits(portable), err_msg=f"{isa} as {kind}")
    close(portable, quantized_reference(x, w, numerics), 2e-6)
    rel = 2e-2 if numerics == Numerics.INT8 else 1e-4  # against unquantized activations
    close(portable, reference(x, w), rel)


@pytest.mark.parametrize("isa", list(dot.Isa), ids=lambda i: i.name)
def test_isa_paths_the_host_lacks_are_reported(isa: dot.Isa) -> None:
    if isa not in dot.supported():
        pytest.skip(f"this host cannot run {isa.name}")
    assert isa <= dot.SELECTED


def test_a_path_argument_names_its_path_in_its_type() -> None:
    # a dot.Path's numba type holds its Isa (so a kernel compiled for it emits that path
    # alone) and survives numba's cache index (pickled); an int is every path
    code = numba.njit(lambda isa: dot.isa_of(isa))
    for isa in dot.Isa:
        t = numba.typeof(dot.path(isa))
        assert t == dot.PathType(isa) != dot.PathType((isa + 1) % len(dot.Isa))
        assert pickle.loads(pickle.dumps(t)) == t
        assert dot.paths_of(t) == [isa]
        assert code(dot.path(isa)) == code(int(isa)) == isa
    assert dot.paths_of(numba.typeof(int(dot.SELECTED))) is None
    assert weights.isa_arg() is dot.path(dot.SELECTED)


@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda t: t.name)
def test_a_row_gets_the_same_bits_alone_in_any_batch_and_thread_split(
    qtype: Q, numerics: Numerics
) -> None:
    raw, _ = blocks(qtype, 70, 256)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), numerics)
    batch = RNG.standard_normal((64, 256)).astype(np.float32)
    together = np.empty((64, 70), np.float32)
    m.matmul(batch, together)
    for t in (0, 31, 63):
        alone = np.empty((1, 70), np.float32)
        with threads.limited(1):
            m.matmul(batch[t : t + 1], alone)
        np.testing.assert_array_equal(bits(alone[0]), bits(together[t]))


def quantized_by_numpy(x: np.ndarray, blk: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows in order, scales (row, block)) of x quantized per block of blk values: amax / qmax
    the scale, floor(x * (qmax / amax) + 0.5) clamped the value, all in float32."""
    n, k = x.shape
    xb = x.reshape(n, k // blk, blk)
    amax = np.abs(xb).max(-1)
    f = np.float32
    inv = np.where(amax > 0, f(qmax) / np.where(amax > 0, amax, f(1)), f(0)).astype(f)
    q = np.floor(xb * inv[..., None] + f(0.5)).clip(-qmax, qmax)
    return q.reshape(n, k), (amax / f(qmax)).astype(f)


@pytest.mark.parametrize("n", [1, 3, 9, 40])
@pytest.mark.parametrize("numerics", INTEGER)
def test_quantized_activations_equal_numpy_on_one_thread_or_split(
    numerics: Numerics, n: int
) -> None:
    # 40 x 1056 values are split over the workers by 32-value units (panels.
    # QUANTIZE_SERIAL_VALUES; 33 units: an odd number of int8 blocks a share, whose pairs'
    # sums must not straddle two workers); the rest, and every size on one thread, serially
    qmax, blk = weights.ACTIVATIONS[numerics][1], BLOCK[numerics]
    k = 1056
    x = (RNG.standard_normal((n, k)) * RNG.choice([1e-3, 1.0, 40.0], (n, k))).astype(np.float32)
    x[0, :blk] = 0  # an all-zero block
    # ties: with amax = qmax the scale is 1 and x * inv + 0.5 an integer: halves round up
    ties = [qmax, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, -qmax]
    x[0, blk : 2 * blk] = np.resize(np.float32(ties), blk)
    want_q, want_scales = quantized_by_numpy(x, blk, qmax)
    assert want_q[0, blk : blk + 8].tolist() == [qmax, 3, -2, 1, 0, 2, -1, -qmax]
    for workers in (1, 2):
        with threads.limited(workers):
            a = weights.quantize(x, numerics)
        np.testing.assert_array_equal(act_rows(a), want_q.astype(a.xq.dtype))
        np.testing.assert_array_equal(a.xa, want_scales.T)
        sums = want_q.reshape(n, k // 16, 16).sum(-1).astype(np.float32)
        per16 = (np.repeat(want_scales, blk // 16, axis=1) * sums).T
        if blk == 32:
            per32 = (want_scales * (sums[:, 0::2] + sums[:, 1::2])).T
        else:
            per32 = per16[0::2] + per16[1::2]
        np.testing.assert_array_equal(a.xb, np.concatenate([per16, per32]))


def test_quantized_activations_round_per_block() -> None:
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    x[1, 32:] = 0  # an all-zero block
    for numerics, qmax in ((Numerics.INT8, 127), (Numerics.INT16, 32767)):
        a, blk = weights.quantize(x, numerics), BLOCK[numerics]
        amax = np.abs(x.reshape(2, 64 // blk, blk)).max(-1)
        scales = (amax / np.float32(qmax)).astype(np.float32)  # (row, block)
        np.testing.assert_array_equal(a.xa, scales.T)
        xq = act_rows(a)
        assert xq.shape == x.shape and np.abs(xq).max() == qmax and not xq[1, 32:].any()
        sums = xq.reshape(2, 4, 16).astype(np.int32).sum(-1).astype(np.float32)
        per16 = (np.repeat(scales, blk // 16, axis=1) * sums).T  # (16 values, row)
        if blk == 32:  # each 32 values: their one scale times their sum
            per32 = (scales * (sums[:, 0::2] + sums[:, 1::2])).T
        else:  # the two blocks' scaled sums, added
            per32 = per16[0::2] + per16[1::2]
        np.testing.assert_array_equal(a.xb, np.concatenate([per16, per32]))
        err = np.abs(xq * np.repeat(scales, blk, axis=1) - x)
        assert (err <= np.repeat(scales, blk, axis=1) * 0.5 * (1 + 1e-6)).all()


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_int8_scales_each_16_activations_apart(qtype: Q) -> None:
    # each 32 activations: 100 and 15 zeros (exact in int8), then 16 values in [-1, 1]. With
    # one scale per 32 the 100 would set the small values' rounding step too (100 / 127)
    raw, w = blocks(qtype)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), Numerics.INT8)
    x = RNG.uniform(-1, 1, (3, COLS)).astype(np.float32)
    x[:, np.arange(COLS) % 32 < 16] = 0
    x[:, ::32] = 100
    got = np.empty((3, ROWS), np.float32)
    m.matmul(x, got)
    # 256 small values, each off by at most half their own step 1 / 127: ~10 standard
    # deviations of their summed error (a step of 100 / 127 would be 100 times that)
    rms_w = np.sqrt((w.astype(np.float64) ** 2).mean())
    bound = 10 * (1 / 127) * np.sqrt(COLS / 2 / 12) * rms_w
    assert np.abs(got - reference(x, w)).max() <= bound


def test_mixed_parts_fuse_along_the_output_dimension() -> None:
    parts = [blocks(t, 20, 256) for t in (Q.Q4_K, Q.Q4_K, Q.Q6_K)]
    dense = RNG.standard_normal((9, 256)).astype(np.float32)
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    want = reference(x, np.concatenate([w for _, w in parts] + [dense]))
    for numerics in Numerics:
        decoded = [(t.name, gguf_types.decode(t, raw)) for t, (raw, _) in
                   zip((Q.Q4_K, Q.Q4_K, Q.Q6_K), parts, strict=True)]  # fmt: skip
        m = weights.fuse([*decoded, dense], numerics)
        assert isinstance(m, weights.FusedMatrix)
        assert [p.shape[0] for p in m.parts] == [40, 20, 9]  # the two Q4_K parts are one
        out = np.empty((2, 69), np.float32)
        m.matmul(x, out)
        close(out, want, 1e-5 if numerics == Numerics.EXACT else 3e-2)


@pytest.mark.parametrize("qtype", [Q.Q5_1, Q.Q4_1, Q.Q8_0, Q.Q6_K], ids=lambda t: t.name)
def test_portable_sums_match_numpy_integers(qtype: Q) -> None:
    dec = gguf_types.decode(qtype, blocks(qtype, 16, 256)[0])
    for numerics in INTEGER:
        m = PackedMatrix.pack(qtype.name, dec, numerics)
        xq = RNG.integers(-100, 100, (1, 256)).astype(
            np.int16 if numerics == Numerics.INT16 else np.int8
        )
        s16 = np.empty(16, np.int32)
        groups = 32 // panels.group_values(m.lanes, m.four_bit)
        panels._portable_sums(m.lanes, m.hb, 0, 0, groups, m.four_bit, xq, 0, 0, s16, 0)
        v = dec.v[:, :32].astype(np.int64)
        if numerics == Numerics.INT16 and dec.bits == 8:  # int16 panels hold v - off
            v -= dec.off
        np.testing.assert_array_equal(s16, v @ xq[0, :32])


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS], ids=lambda t: t.name)
def test_int16_eight_bit_panels_hold_signed_values(qtype: Q) -> None:
    # every 8-bit type has an offset and no minimum: its int16 panels keep v - off as int8,
    # so the sums hold the offset's part (kernels/dot.py); the int8 and exact panels keep v
    dec = gguf_types.decode(qtype, blocks(qtype, 16, 256)[0])
    assert dec.bits == 8 and dec.off > 0 and dec.dm is None
    m = PackedMatrix.pack(qtype.name, dec, Numerics.INT16)
    stored = m.lanes.view(np.uint8).view(np.int8).reshape(256 // 2, 16, 2)
    np.testing.assert_array_equal(
        stored.transpose(1, 0, 2).reshape(16, 256), dec.v.astype(np.int16) - dec.off
    )
    unsigned = PackedMatrix.pack(qtype.name, dec, Numerics.INT8)
    assert int(unsigned.lanes.view(np.uint8).max()) == int(dec.v.max())
    with pytest.raises(ValueError, match="minimum"):
        PackedMatrix.pack(qtype.name, dec._replace(dm=dec.d), Numerics.INT16)


@pytest.mark.parametrize("numerics", list(Numerics))
@pytest.mark.parametrize("qtype", sorted(FIVE_BIT, key=lambda t: t.name), ids=lambda t: t.name)
def test_five_bit_types_keep_five_bits_a_value(qtype: Q, numerics: Numerics) -> None:
    # 4-bit lanes and a plane of fifth bits: 5/8 of the 8-bit panel's value bytes
    dec = gguf_types.decode(qtype, blocks(qtype)[0])
    m = PackedMatrix.pack(qtype.name, dec, numerics)
    x = RNG.standard_normal((3, COLS)).astype(np.float32)
    got, want = np.empty((3, ROWS), np.float32), np.empty((3, ROWS), np.float32)
    m.matmul(x, got)
    if numerics == Numerics.INT16 and dec.dm is not None:
        # int16 panels of 8-bit values hold v - off, which only types without minimums have
        # (kernels/dot.py): Q5_1's and Q5_K's against float64 on the same rounded activations
        assert m.four_bit and m.hb.nbytes > 0
        close(got, quantized_reference(x, gguf_types.dequantize(dec), numerics), 2e-6)
        return
    eight = PackedMatrix.pack(qtype.name, dec._replace(bits=8), numerics)
    assert m.four_bit and m.hb.nbytes > 0 and eight.hb.nbytes == 0
    assert m.lanes.nbytes + m.hb.nbytes == eight.lanes.nbytes * 5 // 8
    eight.matmul(x, want)
    if numerics == Numerics.EXACT:  # fp32 sums, in another order of k
        close(got, want, 1e-6)
    else:  # exact integer sums (with int16 Q5_0's of v - off both ways): the same bits
        np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("sign", [1, -1])
def test_int16_nibble_planes_hold_the_largest_sums(
    sign: int, qtype: Q, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every value the largest (15, or 31 for 5 bits) times full-scale activations: the largest
    # int32 sums the 4- and 5-bit int16 kernels form (nibble 2 of a word is multiplied in place,
    # times 256, its fifth bit with it: 31 * 256 * 32767 * 8 < 2^31), on every path
    dec = gguf_types.decode(qtype, blocks(qtype, 16, 256)[0])
    dec.v[:] = 2**dec.bits - 1
    m = PackedMatrix.pack(qtype.name, dec, Numerics.INT16)
    x = np.full((1, 256), sign * 3.0, np.float32)
    a = weights.quantize(x, Numerics.INT16)
    assert (np.abs(a.xq) == 32767).all()
    for isa in [*map(int, dot.supported()), dot.SELECTED]:  # (as the test above)
        monkeypatch.setattr(weights, "ISA", isa)
        got = np.empty((1, 16), np.float32)
        m.matmul(x, got, acts=a)
        want = quantized_reference(x, gguf_types.dequantize(dec), Numerics.INT16)
        close(got, want, 1e-6)


@pytest.mark.parametrize("which", ["gguf_quant", "gguf_f32"])
def test_the_loaded_file_is_not_kept_mapped(tiny: TinyModels, which: str) -> None:
    # every page of the file the loader read stayed resident while anything mapped it
    path = getattr(tiny, which)
    _, _weights = loader.load(path, Numerics.INT16)  # alive while the maps are read
    assert str(path) not in Path("/proc/self/maps").read_text()


def test_the_features_numba_is_told_are_the_ones_the_paths_are_chosen_from() -> None:
    host = {"avx", "avx2", "avx512f", "avx512bw", "avx512vnni", "avxvnni"}
    told = dot.features_told(host, "+sse4.2, -avx512f,-avxvnni,,avx512ifma")
    assert told == {"avx", "avx2", "avx512bw", "avx512vnni", "sse4.2", "avx512ifma"}
    assert dot.features_told(host, "") == host
    assert dot.features_told(set(), "+avx2,+fma") == {"avx2", "fma"}  # NUMBA_CPU_NAME=znver3


def test_q5_0_in_eight_bit_panels_gives_the_five_bit_panels_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the AVX2 path packs Q5_0 as 8-bit values under int16 activations (weights.
    # five_as_eight_here): the same exact sums of v - 16, the same float steps after them
    raw, w = blocks(Q.Q5_0)
    dec = gguf_types.decode(Q.Q5_0, raw)
    five = PackedMatrix.pack("Q5_0", dec, Numerics.INT16, five_as_eight=False)
    eight = PackedMatrix.pack("Q5_0", dec, Numerics.INT16, five_as_eight=True)
    assert five.four_bit and five.hb.shape[1] > 0
    assert not eight.four_bit and eight.hb.shape[1] == 0
    n = simd.WIDE + simd.ROWS + 3  # a block of each row count the 256-bit paths take, and one
    x = RNG.standard_normal((n, COLS)).astype(np.float32) * 3
    acts = weights.quantize(x, Numerics.INT16)
    want = np.empty((n, ROWS), np.float32)
    five.matmul(x, want, acts=acts)
    close(want, quantized_reference(x, w, Numerics.INT16), 2e-6)
    for isa in map(int, dot.supported()):
        monkeypatch.setattr(weights, "ISA", isa)
        got = np.full((n, ROWS), np.nan, np.float32)
        eight.matmul(x, got, acts=acts)
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=dot.Isa(isa).name)


@pytest.mark.parametrize("isa", list(dot.Isa), ids=lambda i: i.name)
def test_only_the_avx2_path_packs_q5_0_as_eight_bit(
    isa: dot.Isa, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights, "ISA", isa)
    decs = {t: gguf_types.decode(t, blocks(t, 16, 256)[0]) for t in (Q.Q5_0, Q.Q5_1, Q.Q5_K)}
    for qtype, dec in decs.items():
        for numerics in INTEGER:
            packed = PackedMatrix.pack(qtype.name, dec, numerics)
            as_eight = isa == dot.Isa.AVX2 and qtype == Q.Q5_0 and numerics == Numerics.INT16
            assert packed.four_bit != as_eight, (qtype.name, numerics)


@numba.njit(cache=True)
def _unpacked_words(lanes: np.ndarray, hb: np.ndarray, n_groups: int, five: bool) -> np.ndarray:
    out = np.empty(n_groups * 128, np.int16)
    if five:
        simd.unpack_words_5(lanes, 0, hb, 0, n_groups, out)
    else:
        simd.unpack_words_4(lanes, 0, hb, 0, n_groups, out)
    return out


WORD_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_1, Q.Q5_K]


@pytest.mark.parametrize("qtype", WORD_TYPES, ids=lambda t: t.name)
def test_unpacked_words_are_the_values_in_the_eight_bit_layout(qtype: Q) -> None:
    # the first panel's 4- or 5-bit int16 lanes unpacked to words (kernels/simd.py's
    # unpack_words): word r * 2 + b of pair g is row r's value 2 g + b, fifth bit included
    dec = gguf_types.decode(qtype, blocks(qtype, 16, 256)[0])
    m = PackedMatrix.pack(qtype.name, dec, Numerics.INT16, five_as_eight=False)
    assert m.four_bit
    words = _unpacked_words(m.lanes, m.hb, 256 // 8, qtype in FIVE_BIT)
    got = words.reshape(256 // 2, 16, 2).transpose(1, 0, 2).reshape(16, 256)
    np.testing.assert_array_equal(got, dec.v)


@pytest.mark.parametrize(
    ("first", "cols"), [(panels.WORDS_SHORT_ROWS, COLS), (panels.WORDS_ROWS_4, LONG_COLS)]
)
@pytest.mark.parametrize("largest", [False, True])
@pytest.mark.parametrize("qtype", WORD_TYPES, ids=lambda t: t.name)
def test_avx2_words_kernels_equal_portable_bit_for_bit(
    qtype: Q, largest: bool, first: int, cols: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # enough rows that the AVX2 path multiplies unpacked words (kernels/panels.py's
    # WORDS_SHORT_ROWS for panels of K <= WORDS_SHORT_K, WORDS_ROWS_4 for longer ones, and
    # WORDS_ROWS_5), a block of ROWS and a lone row after them; `largest`: every value its
    # largest times full-scale activations, the largest sums the words' int32 lanes take
    if dot.Isa.AVX2 not in dot.supported():
        pytest.skip("this host cannot run AVX2")
    assert COLS <= panels.WORDS_SHORT_K < LONG_COLS
    raw, w = blocks(qtype, cols=cols)
    dec = gguf_types.decode(qtype, raw)
    n = first + simd.ROWS + 1
    x = RNG.standard_normal((n, cols)).astype(np.float32)
    if largest:
        dec.v[:] = 2**dec.bits - 1
        x = np.where(x < 0, -3.0, 3.0).astype(np.float32)
    m = PackedMatrix.pack(qtype.name, dec, Numerics.INT16, five_as_eight=False)
    acts = weights.quantize(x, Numerics.INT16)
    outs = {}
    for isa in (dot.Isa.PORTABLE, dot.Isa.AVX2):
        monkeypatch.setattr(weights, "ISA", int(isa))
        outs[isa] = np.full((n, ROWS), np.nan, np.float32)
        m.matmul(x, outs[isa], acts=acts)
    np.testing.assert_array_equal(bits(outs[dot.Isa.AVX2]), bits(outs[dot.Isa.PORTABLE]))
    want = quantized_reference(x, gguf_types.dequantize(dec) if largest else w, Numerics.INT16)
    close(outs[dot.Isa.PORTABLE], want, 2e-6)

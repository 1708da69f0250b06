"""Integer numerics end to end on the tiny mixed-type models: a request's logits are the same
bits alone, inside a batch of 64 unrelated sequences, prefilled in chunks or whole, after a
cached prefix, at any thread count; exact mode keeps the float64 reference. Every ISA path
against the portable one: test_quant."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from enginecore.batch import Batch, SeqChunk
from enginecore.kernels import attention, threads
from enginecore.model_runner import ModelRunner
from enginecore.weights import Weights
from tests.conftest import TinyModels
from tests.fixtures import reference
from tests.unit.test_model import PROMPT, prefill, ref_for, runner_for

MODELS = ["gguf_q4_k_m", "gguf_q8_0", "gguf_quant"]
INTEGER = ["int8", "int16"]


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def runner(tiny: TinyModels, which: str, numerics: str, kv: str = "f32") -> ModelRunner:
    return runner_for(getattr(tiny, which), num_blocks=700, numerics=numerics, kv_cache_dtype=kv)


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("which", MODELS)
def test_logits_alone_equal_logits_in_a_batch_of_64(
    tiny: TinyModels, which: str, numerics: str, kv: str
) -> None:
    r = runner(tiny, which, numerics, kv)
    rng = np.random.default_rng(5)
    alone = prefill(r, PROMPT, list(range(8)), len(PROMPT))[-1]
    # 63 others: prefill chunks of many lengths and decodes after cached contexts
    chunks = [SeqChunk(PROMPT, 0, list(range(8, 16)), 1)]
    for s in range(63):
        length = int(rng.integers(1, 40))
        ids = rng.integers(0, 256, length).tolist()
        table = list(range(16 + 10 * s, 26 + 10 * s))
        if s % 2:  # a decode after a cached context
            if length > 1:
                prefill(r, ids[:-1], table, 64)
            chunks.append(SeqChunk(ids[-1:], length - 1, table, 1))
        else:
            chunks.append(SeqChunk(ids, 0, table, 1))
    order = rng.permutation(64)
    batch = Batch.build([chunks[i] for i in order], r.block_size)
    together = r.run(batch)
    same_bits(together[int(np.flatnonzero(order == 0)[0])], alone)


@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("which", MODELS)
def test_chunked_prefill_and_a_cached_prefix_equal_the_whole_prefill(
    tiny: TinyModels, which: str, numerics: str
) -> None:
    r = runner(tiny, which, numerics)
    whole = prefill(r, PROMPT, list(range(8)), len(PROMPT))
    for chunk in (1, 4, 9):
        same_bits(prefill(r, PROMPT, list(range(8, 16)), chunk), whole)
    # a second request sharing the first one's cached blocks 0..3 (16 tokens) prefills only
    # its suffix
    table = [0, 1, 2, 3, 20, 21]
    suffix = SeqChunk(PROMPT[16:], 16, table, len(PROMPT) - 16)
    same_bits(r.run(Batch.build([suffix], r.block_size)), whole[16:])


@pytest.mark.parametrize("numerics", INTEGER)
def test_any_thread_count_gives_the_same_logits(tiny: TinyModels, numerics: str) -> None:
    # (every ISA path against the portable one, bit for bit, for every type and row count:
    # test_quant; a whole model compiled for each path took 7 minutes of a cold CI run, for the
    # portable path alone 70 s a numerics)
    r = runner(tiny, "gguf_q4_k_m", numerics)
    outs = []
    for n_threads in (1, 2):
        with threads.limited(n_threads):
            outs.append(prefill(r, PROMPT, list(range(8)), 5))
    same_bits(outs[1], outs[0])


@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("which", MODELS)
def test_a_layer_in_one_numba_call_gives_the_unfused_bits(
    tiny: TinyModels, which: str, numerics: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = runner(tiny, which, numerics)
    assert r.weights.panel_layers() is not None  # mixed types too: a part per type
    rng = np.random.default_rng(3)
    chunks = [SeqChunk(PROMPT, 0, list(range(8)), 2)]
    chunks += [SeqChunk(rng.integers(0, 256, 1).tolist(), 9 + s, list(range(8 + 4 * s, 12 + 4 * s)), 1)
               for s in range(4)]  # fmt: skip
    outs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(Weights, "panel_layers", lambda self: None)
        for n in (1, 2, 5):  # the batch's cache writes are the same in both passes
            outs.append(r.run(Batch.build(chunks[:n], r.block_size)))
    for a, b in zip(outs[:3], outs[3:], strict=True):
        same_bits(a, b)


@pytest.mark.parametrize("numerics", INTEGER)
@pytest.mark.parametrize("which", ["gguf_q8_0", "gguf_q4_k_m"])
def test_all_layers_in_one_numba_call_give_the_bits_of_a_call_per_layer(
    tiny: TinyModels, which: str, numerics: str
) -> None:
    # Q8_0 throughout; or layers whose fused q/k/v differ (one part in layer 1, two in layer
    # 0), cut into the same parts
    r = runner(tiny, which, numerics)
    assert r.stacked is not None  # one call per step
    rng = np.random.default_rng(4)
    chunks = [SeqChunk(PROMPT, 0, list(range(8)), 2)]
    chunks += [SeqChunk(rng.integers(0, 256, 1).tolist(), 9 + s, list(range(8 + 4 * s, 12 + 4 * s)), 1)
               for s in range(4)]  # fmt: skip
    batch = Batch.build(chunks, r.block_size)
    stacked = r.run(batch)
    r.stacked = None
    same_bits(r.run(batch), stacked)


def test_exact_mode_keeps_the_unfused_layers(tiny: TinyModels) -> None:
    assert runner(tiny, "gguf_q4_k_m", "exact").weights.panel_layers() is None


def _paged_case(
    rng: np.random.Generator, bs: int, n_seqs: int, blocks_per_seq: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # the bundled model's attention shapes (9 heads over 3 kv heads of 64): random K (in the
    # cache's layout) and V blocks, each sequence's table a random set of them, a qkv row each
    n_heads, n_kv, hd, n_blocks = 9, 3, 64, n_seqs * blocks_per_seq
    k = attention.k_cache_layout(rng.standard_normal((n_blocks, bs, n_kv, hd), np.float32))
    v = attention.v_cache_layout(rng.standard_normal((n_blocks, bs, n_kv, hd), np.float32))
    tables = rng.permutation(n_blocks).astype(np.int32).reshape(n_seqs, blocks_per_seq)
    qkv = rng.standard_normal((n_seqs, (n_heads + 2 * n_kv) * hd), np.float32)
    return k, v, tables, qkv


def test_a_token_attends_to_the_same_bits_alone_and_among_others() -> None:
    # the bundled model's attention shapes (9 heads over 3 kv heads of 64, contexts ~150): the
    # kernel for one token and for eight runs the same compiled sums
    rng = np.random.default_rng(0)
    n_heads, hd = 9, 64
    k, v, tables, qkv = _paged_case(rng, 32, 8, 8)
    positions = (140 + 13 * np.arange(8) % 100).astype(np.int32)
    seq = np.arange(8, dtype=np.int32)
    outs = []
    for n in (1, 2, 8):
        out = np.zeros((n, n_heads * hd), np.float32)
        p = attention.plan(seq[:n], None)
        attention.attend(qkv[:n], p, seq[:n], positions[:n], tables, k, v, n_heads, out)
        outs.append(out)
    same_bits(outs[0], outs[2][:1])
    same_bits(outs[1], outs[2][:2])


def test_rows_attended_longest_context_first_get_the_same_bits() -> None:
    # attention.plan orders the kernel's rows by context, longest first, when given positions:
    # every row still lands in its own place of out, the same bits as in batch order
    rng = np.random.default_rng(5)
    n, n_heads, hd = 10, 9, 64
    k, v, tables, qkv = _paged_case(rng, 16, n, 16)
    positions = rng.integers(5, 250, n).astype(np.int32)
    seq = np.arange(n, dtype=np.int32)
    p = attention.plan(seq, None, positions)
    assert sorted(p.kernel_tokens.tolist()) == list(range(n))
    assert (np.diff(positions[p.kernel_tokens]) <= 0).all()
    outs = []
    for plan in (attention.plan(seq, None), p):
        out = np.full((n, n_heads * hd), np.nan, np.float32)
        attention.attend(qkv, plan, seq, positions, tables, k, v, n_heads, out)
        outs.append(out)
    same_bits(outs[0], outs[1])
    assert not np.isnan(outs[1]).any()


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("window", [0, 7])
def test_a_prefill_chunk_attends_to_the_same_bits_as_each_of_its_rows_alone(
    window: int, kv: str
) -> None:
    # however the kernel groups a chunk's consecutive rows (they share their K and V rows), a
    # row must not see whether it was in a group, nor where in it
    rng = np.random.default_rng(1)
    n_heads, n_kv, hd, bs, n_blocks = 9, 3, 64, 4, 48
    k = rng.standard_normal((n_blocks, bs, n_kv, hd), np.float32)
    v = rng.standard_normal((n_blocks, bs, n_kv, hd), np.float32)
    if kv == "f16":
        k, v = (a.astype(np.float16).view(np.uint16) for a in (k, v))
    kc, vc = attention.k_cache_layout(k), attention.v_cache_layout(v)
    tables = rng.permutation(n_blocks).astype(np.int32).reshape(1, n_blocks)
    n = 21
    qkv = rng.standard_normal((n, (n_heads + 2 * n_kv) * hd), np.float32)
    positions = np.arange(150, 150 + n, dtype=np.int32)
    seq = np.zeros(n, np.int32)
    chunk = np.zeros((n, n_heads * hd), np.float32)
    attention.attend(qkv, attention.plan(seq, None), seq, positions, tables, kc, vc, n_heads,
                     chunk, window)  # fmt: skip
    for t in range(n):
        alone = np.zeros((1, n_heads * hd), np.float32)
        one = seq[t : t + 1]
        attention.attend(qkv[t : t + 1], attention.plan(one, None), one, positions[t : t + 1],
                         tables, kc, vc, n_heads, alone, window)  # fmt: skip
        same_bits(alone[0], chunk[t])
    # and it is attention: row t's softmax over its visible keys, against float64
    kf, vf = (a.view(np.float16).astype(np.float32) if kv == "f16" else a for a in (k, v))
    keys = kf[tables[0]].reshape(-1, n_kv, hd).astype(np.float64)
    values = vf[tables[0]].reshape(-1, n_kv, hd).astype(np.float64)
    t, h = n - 1, 4
    p = positions[t]
    lo = max(p + 1 - window, 0) if window else 0
    s = keys[lo : p + 1, h // 3] @ qkv[t, h * hd : (h + 1) * hd].astype(np.float64) / 8.0
    e = np.exp(s - s.max())
    ref = (e / e.sum()) @ values[lo : p + 1, h // 3]
    np.testing.assert_allclose(chunk[t, h * hd : (h + 1) * hd], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("numerics", ["exact", *INTEGER])
@pytest.mark.parametrize("which", ["gguf_q4_k_m", "gguf_q8_0"])
def test_logits_stay_close_to_the_float64_reference(
    tiny: TinyModels, which: str, numerics: str
) -> None:
    cfg, state = ref_for(getattr(tiny, which))
    want, _ = reference.forward(cfg, state, PROMPT)
    got = prefill(runner(tiny, which, numerics), PROMPT, list(range(8)), len(PROMPT))
    tol = {"exact": 2e-4, "int16": 1e-3, "int8": 5e-2}[numerics]
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


def test_a_type_not_served_is_refused_naming_tensor_and_type(
    tiny: TinyModels, tmp_path: Path
) -> None:
    reader = gguf.GGUFReader(tiny.gguf_q8_0)
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith(("llama.", "tokenizer.")):
            sub = field.types[-1] if len(field.types) > 1 else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    tq2 = gguf.GGMLQuantizationType.TQ2_0
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name == "blk.1.ffn_up.weight":  # (512, 256): any bytes are TQ2_0 blocks
            size = gguf.GGML_QUANT_SIZES[tq2][1]
            raw = np.random.default_rng(0).integers(0, 256, (512, size), dtype=np.uint8)
            writer.add_tensor(t.name, raw, raw_dtype=tq2)
        else:
            writer.add_tensor(t.name, data, raw_dtype=gguf.GGMLQuantizationType(t.tensor_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight: GGUF type TQ2_0 is not served"):
        ModelRunner.from_path(tmp_path / "bad.gguf", 4, 8, 0, 64)


@pytest.mark.parametrize("window", [0, 300])
def test_a_long_context_attends_to_the_same_bits_alone_among_others_and_on_any_workers(
    window: int,
) -> None:
    # a context of several SPAN_CHUNK runs is split into items per run, as many as the token
    # has, whatever the batch (one item per kv head and run alone, all heads per run among
    # others) and however many workers share them: the same bits every time
    rng = np.random.default_rng(3)
    n_heads, hd, n = 9, 64, 6
    run = attention.SPAN_CHUNK
    k, v, tables, qkv = _paged_case(rng, 16, n, -(-4 * run // 16))
    positions = np.array([3 * run + 40, run - 1, 2 * run, run + 3, 50, 4 * run - 1], np.int32)
    seq = np.arange(n, dtype=np.int32)
    outs = []
    for rows, workers in ((1, 1), (1, 2), (1, 3), (2, 2), (n, 2), (n, 3)):
        out = np.full((rows, n_heads * hd), np.nan, np.float32)
        attention.paged_attention(qkv[:rows], seq[:rows], seq[:rows], positions[:rows], tables, k,
                                  v, n_heads, out, workers, window, 0.125)  # fmt: skip
        outs.append(out)
    for out in outs[1:]:
        same_bits(outs[0], out[:1])
    same_bits(outs[3], outs[4][:2])
    same_bits(outs[4], outs[5])
    assert not np.isnan(outs[5]).any()

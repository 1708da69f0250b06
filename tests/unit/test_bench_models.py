"""bench.models: the random-weight GGUF loads as the shape it claims, with the source's tokenizer."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bench import models
from enginecore.loader.gguf import read_config
from shared.gguf_file import gguf_reader
from shared.tokenizer_metadata import read_tokenizer_metadata
from tests.conftest import TinyModels

SHAPE = models.Shape("test", 128, 2, 4, 2, 256, 50_000.0)


@pytest.fixture(scope="module")
def written(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-models") / "random.gguf"
    models.write_random(SHAPE, out, tiny.gguf_f32)
    return out


def test_random_model_has_the_shape_and_tied_embeddings(written: Path, tiny: TinyModels) -> None:
    cfg = read_config(gguf_reader(written))
    gguf_reader.cache_clear()
    vocab = len(read_tokenizer_metadata(tiny.gguf_f32).tokens)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (128, 2, 4, 2)
    assert (cfg.intermediate_size, cfg.head_dim, cfg.layer_rope[0].theta) == (256, 32, 50_000.0)
    assert cfg.tie_embeddings
    assert cfg.vocab_size == vocab


def test_random_model_carries_the_source_tokenizer(written: Path, tiny: TinyModels) -> None:
    src, out = gguf.GGUFReader(tiny.gguf_f32), gguf.GGUFReader(written)
    keys = [k for k in src.fields if k.startswith("tokenizer.")]
    assert keys
    for key in keys:
        assert out.fields[key].contents() == src.fields[key].contents(), key
    assert read_tokenizer_metadata(written) == read_tokenizer_metadata(tiny.gguf_f32)


def test_random_weights_are_f16_normal_and_norms_are_ones(written: Path) -> None:
    reader = gguf.GGUFReader(written)
    by_name = {t.name: t for t in reader.tensors}
    vocab = int(reader.fields["llama.vocab_size"].contents())
    assert set(by_name) == {name for name, _ in models.tensors(SHAPE, vocab)}
    assert np.asarray(by_name["token_embd.weight"].data).shape == (vocab, 128)
    q = by_name["blk.1.ffn_down.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.F16
    w = np.asarray(q.data, np.float32)
    assert w.shape == (128, 256)  # (out, in)
    assert abs(w.std() - models.WEIGHT_STD) < 0.002 and abs(w.mean()) < 0.002
    norm = by_name["blk.0.attn_norm.weight"]
    assert norm.tensor_type == gguf.GGMLQuantizationType.F32
    assert np.all(np.asarray(norm.data) == 1.0)
    # each matrix has its own draw
    assert not np.array_equal(np.asarray(by_name["blk.0.ffn_up.weight"].data),
                              np.asarray(by_name["blk.0.ffn_gate.weight"].data))  # fmt: skip


def test_catalogue_names_and_resolve(tmp_path: Path) -> None:
    names = models.catalogue()
    assert names["bundled"] == models.BUNDLED
    assert {"Q4_K_M", "Q8_0", "360M", "1.7B", "1.7B-Q4_K_M", "360M-F16"} <= set(names)
    assert names["1.7B"].name == "SmolLM2-1.7B-shape.random.Q4_1.gguf"
    path = tmp_path / "some.gguf"
    path.write_bytes(b"")
    assert models.resolve(str(path)) == path
    with pytest.raises(SystemExit, match="no model"):
        models.resolve(str(tmp_path / "absent.gguf"))


def test_ensure_keeps_an_existing_file_and_never_leaves_a_partial_one(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"

    def write(tmp: Path) -> None:
        tmp.write_text("new")

    models.ensure(out, write)
    assert out.read_text() == "new"
    out.write_text("kept")
    models.ensure(out, write)
    assert out.read_text() == "kept"

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        models.ensure(tmp_path / "other.gguf", fail)
    assert not (tmp_path / "other.gguf").exists()

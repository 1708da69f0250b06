"""What the core keeps resident after start-up: the weights and the KV cache, not the file."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from enginecore.__main__ import build
from enginecore.channel import Channel
from shared.config import EngineConfig
from shared.gguf_file import gguf_reader
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import FakeChannel


def test_a_started_core_holds_no_parsed_gguf(tiny: TinyModels) -> None:
    # the parsed file (one Python object per vocabulary entry, the file mapped) was 150 MB
    # of the bundled model's core when the tokenizer metadata was read after the weights
    cfg = EngineConfig(model_dir=str(tiny.gguf_quant), num_kv_blocks=8)
    build(cfg, cast(Channel, FakeChannel()))
    assert gguf_reader.cache_info().currsize == 0
    assert str(tiny.gguf_quant) not in Path("/proc/self/maps").read_text()

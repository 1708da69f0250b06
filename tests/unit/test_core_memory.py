"""What the core keeps resident after start-up: the weights and the KV cache, not the file."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import gguf
import pytest

from enginecore import loader
from enginecore.__main__ import build
from enginecore.channel import Channel
from enginecore.loader import gguf as loader_gguf
from enginecore.weights import Numerics
from frontend.text.served_model import ServedModel
from shared.config import EngineConfig
from shared.gguf_file import GgufFile, gguf_reader
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import FakeChannel


def test_a_started_core_holds_no_parsed_gguf(tiny: TinyModels) -> None:
    # the parsed file (one Python object per vocabulary entry, the file mapped) was 150 MB
    # of the bundled model's core when the tokenizer metadata was read after the weights
    cfg = EngineConfig(model_dir=str(tiny.gguf_quant), num_kv_blocks=8)
    build(cfg, cast(Channel, FakeChannel()))
    assert gguf_reader.cache_info().currsize == 0
    assert str(tiny.gguf_quant) not in Path("/proc/self/maps").read_text()


def test_a_frontend_holds_no_parsed_gguf(tiny: TinyModels) -> None:
    ServedModel.load(tiny.gguf_quant, "m")
    assert gguf_reader.cache_info().currsize == 0
    assert str(tiny.gguf_quant) not in Path("/proc/self/maps").read_text()


def _resident_bytes(path: Path) -> int:
    """Bytes of `path` resident in this process's mappings of it."""
    total, current = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            current = len(fields) == 6 and fields[5] == str(path)
        elif current and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def test_the_loader_reads_tensors_without_the_mapping(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    # read through the reader's mapping, every page of the file stayed resident until the
    # reader was dropped at the end of the load: the file's size on top of the weights
    path = tiny.gguf_q8_0
    seen: list[int] = []

    class Reader:
        def __call__(self, p: Path) -> GgufFile:
            return gguf_reader(p)

        def cache_clear(self) -> None:
            seen.append(_resident_bytes(path))
            gguf_reader.cache_clear()

    monkeypatch.setattr(loader_gguf, "gguf_reader", Reader())
    gguf_reader.cache_clear()
    loader.load(path, Numerics.INT16)
    tensor_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
    assert len(seen) == 1 and tensor_bytes > 1 << 20
    assert seen[0] < tensor_bytes // 4

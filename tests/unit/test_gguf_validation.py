"""The project's GGUF parse gives what the gguf package's reader gives, and an untrusted GGUF
cannot crash or exhaust the server at load: every corruption of a small model ends in a clean
refusal (ValueError naming the key or tensor), never another exception or a multi-GB
allocation. The sweep runs in a child process under a 2 GB data limit."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from enginecore.loader.gguf import _tensor_data
from shared.gguf_file import MAX_ARRAY_ITEMS, gguf_reader
from shared.tokenizer_metadata import read_tokenizer_metadata
from tests.conftest import TinyModels, require_llama_cpp_data

REPO = Path(__file__).resolve().parents[2]
HUGE = (2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1)


@pytest.mark.parametrize(
    "name", ["gguf_quant", "gguf_f32", "gguf_q4_k_m", "ggml-vocab-llama-spm", "ggml-vocab-phi-3"]
)
def test_the_parse_equals_the_gguf_packages_reader(tiny: TinyModels, name: str) -> None:
    # every value as GGUFReader's contents() gives it (type included: a float32 scalar is a
    # float, a bool a bool), every tensor's place, and its data as the reader shapes it
    if name.startswith("ggml-vocab"):  # SentencePiece: scores (float arrays), token types
        path = require_llama_cpp_data() / f"{name}.gguf"
    else:
        path = getattr(tiny, name)
    gguf_reader.cache_clear()
    ours, theirs = gguf_reader(path), gguf.GGUFReader(path)
    gguf_reader.cache_clear()
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.fields) == list(fields)
    for key, value in fields.items():
        got = ours.fields[key]
        assert (type(got), got) == (type(value), value), key
        if isinstance(value, list):
            assert [type(v) for v in got] == [type(v) for v in value], key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, t in zip(ours.tensors, theirs.tensors, strict=True):
        place = (int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.n_bytes))
        assert (mine.tensor_type, mine.shape, mine.n_bytes) == place, t.name
        assert mine.data_offset == int(t.data_offset), t.name
        data = _tensor_data(mine)
        assert (data.dtype, data.shape) == (t.data.dtype, t.data.shape), t.name
        np.testing.assert_array_equal(data.view(np.uint8), np.asarray(t.data).view(np.uint8))


def test_a_string_that_is_not_utf8_is_refused_where_it_is_read(
    tiny: TinyModels, tmp_path: Path
) -> None:
    data = bytearray(tiny.gguf_quant.read_bytes())
    at = field_offset(bytes(data), "tokenizer.ggml.tokens") + 4 + 4 + 8 + 8  # the first token
    data[at] = 0xFF
    path = tmp_path / "bad-utf8.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.tokens is not valid UTF-8"):
        read_tokenizer_metadata(path)


def field_offset(data: bytes, key: str) -> int:
    """Offset of the value type (u32) following metadata key `key`."""
    raw = key.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw)
    return at + 8 + len(raw)


def tensor_info(data: bytes, name: str) -> int:
    """Offset of n_dims (u32) of tensor info `name`."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw)
    return at + 8 + len(raw)


def patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def cases(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Named corruptions and the words their refusal must contain."""
    tokens = field_offset(data, "tokenizer.ggml.tokens")
    arch = field_offset(data, "general.architecture")
    embd = tensor_info(data, "token_embd.weight")
    n_dims = struct.unpack_from("<I", data, embd)[0]
    offset_at = embd + 4 + 8 * n_dims + 4
    return {
        "bad magic": (b"GGUX" + data[4:], "bad magic"),
        "version 9": (patched(data, 4, "<I", 9), "version 9"),
        "truncated header": (data[:200], "truncated"),
        "truncated data": (data[: len(data) - 100], "outside the file"),
        "huge tensor count": (patched(data, 8, "<Q", 10**12), "too many"),
        "huge key count": (patched(data, 16, "<Q", 10**12), "too many"),
        "huge array": (patched(data, tokens + 8, "<Q", 10**12), "tokenizer.ggml.tokens"),
        "array just over the bound": (
            patched(data, tokens + 8, "<Q", MAX_ARRAY_ITEMS + 1),
            "tokenizer.ggml.tokens",
        ),
        "huge string": (patched(data, arch + 4, "<Q", 10**15), "general.architecture"),
        "unknown value type": (patched(data, arch, "<I", 77), "general.architecture"),
        "nested array": (patched(data, tokens + 4, "<I", 9), "tokenizer.ggml.tokens"),
        "five dimensions": (patched(data, embd, "<I", 5), "token_embd.weight"),
        "huge dimension": (patched(data, embd + 4, "<Q", 1 << 40), "token_embd.weight"),
        "data offset past the end": (patched(data, offset_at, "<Q", 1 << 40), "token_embd.weight"),
        "unknown tensor type": (patched(data, offset_at - 4, "<I", 99), "token_embd.weight"),
        "a key twice": (renamed(data, "tokenizer.ggml.model", "general.architecture"), "twice"),
    }


def renamed(data: bytes, key: str, other: str) -> bytes:
    """Metadata key `key` renamed `other` (of the same length)."""
    assert len(key) == len(other)
    at = field_offset(data, key) - len(key)
    return data[:at] + other.encode() + data[at + len(key) :]


def test_each_corruption_is_refused_naming_what_is_wrong(tiny: TinyModels, tmp_path: Path) -> None:
    data = tiny.gguf_quant.read_bytes()
    for i, (name, (corrupt, words)) in enumerate(cases(data).items()):
        path = tmp_path / f"case{i}.gguf"
        path.write_bytes(corrupt)
        with pytest.raises(ValueError, match=words) as info:
            gguf_reader(path)
        assert str(path) in str(info.value), name


def sweep(data: bytes, header_end: int, seed: int = 0) -> list[bytes]:
    """Truncations everywhere, header bytes flipped, header integers replaced by huge ones."""
    rng = np.random.default_rng(seed)
    out = [data[:n] for n in np.linspace(0, len(data) - 1, 60).astype(int)]
    for _ in range(240):
        b = bytearray(data)
        for at in rng.integers(0, header_end, int(rng.integers(1, 4))):
            b[at] = int(rng.integers(0, 256))
        out.append(bytes(b))
    for _ in range(120):
        at = int(rng.integers(0, header_end - 8))
        huge = HUGE[int(rng.integers(0, len(HUGE)))]
        out.append(patched(data, at, "<Q", huge))
    return out


@pytest.mark.slow
def test_a_sweep_of_corruptions_never_crashes_or_exhausts_the_loader(
    tiny: TinyModels, tmp_path: Path
) -> None:
    data = tiny.gguf_quant.read_bytes()
    header_end = min(int(t.data_offset) for t in gguf_reader(tiny.gguf_quant).tensors)
    files = []
    for i, corrupt in enumerate(sweep(data, header_end)):
        path = tmp_path / f"fuzz{i:04d}.gguf"
        path.write_bytes(corrupt)
        files.append(str(path))
    done = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.gguf_fuzz_child", *files],
        cwd=REPO,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    outcomes = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(outcomes) == len(files)
    crashed = [o for o in outcomes if o["outcome"] == "crashed"]
    assert not crashed, crashed[:5]
    counts = {k: sum(o["outcome"] == k for o in outcomes) for k in ("loaded", "refused")}
    assert counts["refused"] > len(files) // 2, counts  # most corruptions are caught

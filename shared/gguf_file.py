"""The parsed GGUF file of a path, read once per process and shared by whoever needs it.

A GGUF from an untrusted source must not crash or exhaust the server: the header is walked
with bounds on every count and length and every tensor's type, shape and data range is held
against the file, so a bad file is refused with a ValueError naming the key or tensor. The
walk is also the parse: it gives every metadata value as a Python value and every tensor's
place in the file. The `gguf` package's GGUFReader made two numpy views of the file per
vocabulary string, 2.6-3.8 s for GPT-2's 50k tokens and merges, 11-14 s for Llama 3's
vocabulary and 27 s for Gemma's 262k tokens, in each of the two processes at every start;
this walk takes 0.1-0.6 s. Like that reader it refuses a key given twice and a
general.alignment that is not a UINT32 power of two (the walk used to skip one of another
type). The package still names the tensor types and their block sizes here, and the loader
dequantizes with it.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

MAGIC: Final = b"GGUF"
MAX_TENSORS: Final = 1 << 16
MAX_KEYS: Final = 1 << 12
MAX_KEY_BYTES: Final = 1 << 10
MAX_STRING_BYTES: Final = 1 << 24  # a chat template is ~10 KB, the largest seen ~300 KB
MAX_ARRAY_ITEMS: Final = 1 << 21  # vocabularies reach 262k tokens, merges ~500k
MAX_DIMS: Final = 4
MAX_DIM: Final = 1 << 31
# GGUF value types: struct format of a scalar; STRING = 8 and ARRAY = 9 are variable
_SCALAR_FORMATS: Final = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64: Final = struct.Struct("<Q")


@dataclass(frozen=True)
class GgufTensor:
    """Where one tensor's data lies in its file, and what it is."""

    path: Path
    name: str
    tensor_type: int  # a gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # GGUF order: the row length (ne[0]) first
    n_bytes: int
    data_offset: int  # from the start of the file


@dataclass(frozen=True)
class GgufFile:
    """A checked GGUF's metadata and tensor table (the data itself stays in the file)."""

    path: Path
    fields: dict[str, object]  # key -> str, int, float, bool or a list of one of them
    tensors: list[GgufTensor]
    undecodable: frozenset[str]  # string keys whose bytes are not UTF-8 (kept with U+FFFD)

    def value(self, key: str, default: object = None, kind: Any = object) -> Any:
        """The value of `key` as `kind` (list[str], int, ...; `object`: as stored), `default`
        if absent; a ValueError if it is not valid UTF-8, or of another type (a single string
        where a vocabulary belongs would otherwise be a vocabulary of its characters)."""
        if key in self.undecodable:
            raise ValueError(f"{self.path}: GGUF metadata {key} is not valid UTF-8")
        if key not in self.fields:
            return default
        try:
            return msgspec.convert(self.fields[key], kind)
        except msgspec.ValidationError as e:
            raise ValueError(f"{self.path}: GGUF metadata {key} has the wrong type: {e}") from e


@functools.lru_cache(maxsize=1)
def gguf_reader(path: Path) -> GgufFile:
    """The parsed, checked GGUF at `path`, shared by the core's loader and the metadata reader."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            # the header is metadata + tensor infos: bounded by these limits, and by the file
            data = f.read(min(size, 64 << 20))
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e}") from e
    return _parse(_Header(path, data, size))


class _Header:
    """A bounds-checked cursor over the header bytes."""

    def __init__(self, path: Path, data: bytes, size: int) -> None:
        self.path, self.data, self.size, self.pos = path, data, size, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"{self.path}: truncated GGUF header at {what}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what))[0])

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> bytes:
        return self.strings(1, what, limit)[0]

    def strings(self, count: int, what: str, limit: int = MAX_STRING_BYTES) -> list[bytes]:
        """`count` strings in a row (a vocabulary: this loop is most of a parse)."""
        data, pos, out = self.data, self.pos, []
        for _ in range(count):
            if pos + 8 > len(data):
                raise ValueError(f"{self.path}: truncated GGUF header at {what}")
            (n,) = _U64.unpack_from(data, pos)
            if n > limit:
                raise ValueError(f"{self.path}: {what} is {n} bytes long (at most {limit})")
            if pos + 8 + n > len(data):
                raise ValueError(f"{self.path}: truncated GGUF header at {what}")
            out.append(data[pos + 8 : pos + 8 + n])
            pos += 8 + n
        self.pos = pos
        return out


def _parse(h: _Header) -> GgufFile:
    """Walk the metadata and tensor infos, refusing counts, lengths, types, shapes and data
    ranges beyond bounds or beyond the file."""
    import gguf  # shared's one third-party exception, here so importing shared never loads it

    path = h.path
    if h.take(4, "magic") != MAGIC:
        raise ValueError(f"{path}: not a GGUF file (bad magic)")
    version = h.u32("version")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not served (2 or 3)")
    num_tensors, num_keys = h.u64("tensor_count"), h.u64("kv_count")
    if num_tensors > MAX_TENSORS or num_keys > MAX_KEYS:
        raise ValueError(f"{path}: {num_tensors} tensors and {num_keys} metadata keys: too many")
    fields: dict[str, object] = {}
    undecodable: set[str] = set()
    for _ in range(num_keys):
        key = h.string("a metadata key", MAX_KEY_BYTES).decode("utf-8", errors="replace")
        if key in fields:
            raise ValueError(f"{path}: metadata key {key} appears twice")
        kind = h.u32(key)
        if key == "general.alignment" and kind != 4:  # UINT32, as llama.cpp and gguf read it
            raise ValueError(f"{path}: general.alignment has value type {kind}, not UINT32")
        value, decoded = _value(h, kind, key)
        fields[key] = value
        if not decoded:
            undecodable.add(key)
    alignment = fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    assert isinstance(alignment, int)
    if not 1 <= alignment <= 1 << 16 or alignment & (alignment - 1):
        raise ValueError(f"{path}: general.alignment = {alignment}")
    infos = []
    for i in range(num_tensors):
        name = h.string(f"the name of tensor {i}", MAX_KEY_BYTES).decode("utf-8", "replace")
        n_dims = h.u32(name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"{path}: tensor {name} has {n_dims} dimensions")
        dims = tuple(h.u64(name) for _ in range(n_dims))
        infos.append((name, dims, h.u32(name), h.u64(name)))
    data_start = -(-h.pos // alignment) * alignment
    tensors, seen = [], set()
    for name, dims, kind, offset in infos:
        if name in seen:
            raise ValueError(f"{path}: tensor {name} appears twice")
        seen.add(name)
        tensors.append(_tensor(path, h.size, name, dims, kind, data_start + offset))
    return GgufFile(path, fields, tensors, frozenset(undecodable))


def _tensor(
    path: Path, size: int, name: str, dims: tuple[int, ...], kind: int, start: int
) -> GgufTensor:
    """A known type, sane dimensions, and its bytes inside the file."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(kind)
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ValueError(f"{path}: tensor {name} has unknown type {kind}") from None
    if any(not 1 <= d <= MAX_DIM for d in dims) or dims[0] % block:
        raise ValueError(f"{path}: tensor {name} ({qtype.name}) has dimensions {list(dims)}")
    elements = 1
    for d in dims:
        elements *= d
    n_bytes = elements // block * block_bytes
    if start + n_bytes > size:
        raise ValueError(
            f"{path}: tensor {name} ({qtype.name} {list(dims)}) needs bytes {start}.."
            f"{start + n_bytes}, but the file holds {size}: it lies outside the file"
        )
    return GgufTensor(path, name, int(qtype), dims, n_bytes, start)


def _value(h: _Header, kind: int, key: str) -> tuple[object, bool]:
    """A metadata value, and False if a string in it is not UTF-8."""
    if kind in _SCALAR_FORMATS:
        fmt = "<" + _SCALAR_FORMATS[kind]
        return struct.unpack(fmt, h.take(struct.calcsize(fmt), key))[0], True
    if kind == _STRING:
        texts, decoded = _decoded([h.string(key)])
        return texts[0], decoded
    if kind != _ARRAY:
        raise ValueError(f"{h.path}: metadata {key} has unknown type {kind}")
    item, count = h.u32(key), h.u64(key)
    if count > MAX_ARRAY_ITEMS:
        raise ValueError(f"{h.path}: metadata {key} has {count} items (at most {MAX_ARRAY_ITEMS})")
    if item in _SCALAR_FORMATS:
        fmt = f"<{count}{_SCALAR_FORMATS[item]}"
        return list(struct.unpack(fmt, h.take(struct.calcsize(fmt), key))), True
    if item == _STRING:
        return _decoded(h.strings(count, key))
    raise ValueError(f"{h.path}: metadata {key} is an array of type {item}")


def _decoded(raw: list[bytes]) -> tuple[list[str], bool]:
    try:
        return [b.decode("utf-8") for b in raw], True
    except UnicodeDecodeError:
        return [b.decode("utf-8", errors="replace") for b in raw], False

"""The parsed GGUF file of a path, read once per process and shared by whoever needs it.

A GGUF from an untrusted source must not crash or exhaust the server: before the `gguf`
package parses a file, `scan_header` walks its header with bounds on every count and length
(the package would build one Python object per array element of whatever count the file
claims) and holds every tensor's type, shape and data range against the file; after,
`check_tensors` checks what the package built. A bad file is refused with a ValueError naming
the key or tensor.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import gguf

MAGIC: Final = b"GGUF"
MAX_TENSORS: Final = 1 << 16
MAX_KEYS: Final = 1 << 12
MAX_KEY_BYTES: Final = 1 << 10
MAX_STRING_BYTES: Final = 1 << 24  # a chat template is ~10 KB, the largest seen ~300 KB
MAX_ARRAY_ITEMS: Final = 1 << 21  # vocabularies reach 262k tokens, merges ~500k
MAX_DIMS: Final = 4
MAX_DIM: Final = 1 << 31
# GGUF value types: size of a scalar; STRING = 8 and ARRAY = 9 are variable
_SCALAR_BYTES: Final = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@functools.lru_cache(maxsize=1)
def gguf_reader(path: Path) -> gguf.GGUFReader:
    """The parsed, checked GGUF at `path`, shared by the core's loader and the metadata reader."""
    import gguf  # shared's one third-party exception, here so importing shared never loads it

    scan_header(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the package trusts its input: any failure is a malformed file
        raise ValueError(f"{path}: not a readable GGUF file: {type(e).__name__}: {e}") from e
    check_tensors(path, reader)
    return reader


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
        n = self.u64(what)
        if n > limit:
            raise ValueError(f"{self.path}: {what} is {n} bytes long (at most {limit})")
        return self.take(n, what)


def scan_header(path: Path) -> None:
    """Walk the metadata and tensor infos, refusing counts, lengths, types, shapes and data
    ranges beyond bounds or beyond the file."""
    import gguf

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            # the header is metadata + tensor infos: bounded by these limits, and by the file
            data = f.read(min(size, 64 << 20))
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e}") from e
    h = _Header(path, data, size)
    if h.take(4, "magic") != MAGIC:
        raise ValueError(f"{path}: not a GGUF file (bad magic)")
    version = h.u32("version")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not served (2 or 3)")
    num_tensors, num_keys = h.u64("tensor_count"), h.u64("kv_count")
    if num_tensors > MAX_TENSORS or num_keys > MAX_KEYS:
        raise ValueError(f"{path}: {num_tensors} tensors and {num_keys} metadata keys: too many")
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for _ in range(num_keys):
        key = h.string("a metadata key", MAX_KEY_BYTES).decode("utf-8", errors="replace")
        kind = h.u32(key)
        if key == "general.alignment" and kind == 4:  # UINT32
            alignment = h.u32(key)
            if not 1 <= alignment <= 1 << 16 or alignment & (alignment - 1):
                raise ValueError(f"{path}: general.alignment = {alignment}")
        else:
            _skip_value(h, kind, key)
    infos = []
    for i in range(num_tensors):
        name = h.string(f"the name of tensor {i}", MAX_KEY_BYTES).decode("utf-8", "replace")
        n_dims = h.u32(name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"{path}: tensor {name} has {n_dims} dimensions")
        dims = [h.u64(name) for _ in range(n_dims)]
        infos.append((name, dims, h.u32(name), h.u64(name)))
    data_start = -(-h.pos // alignment) * alignment
    for name, dims, kind, offset in infos:
        _check_tensor(path, size, name, dims, kind, data_start + offset)


def _check_tensor(path: Path, size: int, name: str, dims: list[int], kind: int, start: int) -> None:
    """A known type, sane dimensions, and its bytes inside the file."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(kind)
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ValueError(f"{path}: tensor {name} has unknown type {kind}") from None
    if any(not 1 <= d <= MAX_DIM for d in dims) or dims[0] % block:
        raise ValueError(f"{path}: tensor {name} ({qtype.name}) has dimensions {dims}")
    elements = 1
    for d in dims:
        elements *= d
    end = start + elements // block * block_bytes
    if end > size:
        raise ValueError(
            f"{path}: tensor {name} ({qtype.name} {dims}) needs bytes {start}..{end}, "
            f"but the file holds {size}: it lies outside the file"
        )


def _skip_value(h: _Header, kind: int, key: str) -> None:
    if kind in _SCALAR_BYTES:
        h.take(_SCALAR_BYTES[kind], key)
    elif kind == _STRING:
        h.string(key)
    elif kind == _ARRAY:
        item, count = h.u32(key), h.u64(key)
        if count > MAX_ARRAY_ITEMS:
            raise ValueError(
                f"{h.path}: metadata {key} has {count} items (at most {MAX_ARRAY_ITEMS})"
            )
        if item in _SCALAR_BYTES:
            h.take(_SCALAR_BYTES[item] * count, key)
        elif item == _STRING:
            for _ in range(count):
                h.string(key)
        else:
            raise ValueError(f"{h.path}: metadata {key} is an array of type {item}")
    else:
        raise ValueError(f"{h.path}: metadata {key} has unknown type {kind}")


def check_tensors(path: Path, reader: gguf.GGUFReader) -> None:
    """After parsing: tensor names are unique and each one's data is what its info says."""
    seen: set[str] = set()
    for t in reader.tensors:
        if t.name in seen:
            raise ValueError(f"{path}: tensor {t.name} appears twice")
        seen.add(t.name)
        if t.data.nbytes != t.n_bytes:
            raise ValueError(f"{path}: tensor {t.name} lies outside the file")

"""The parsed GGUF file of a path, read once per process and shared by whoever needs it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gguf


@functools.lru_cache(maxsize=1)
def gguf_reader(path: Path) -> gguf.GGUFReader:
    """The parsed GGUF at `path`, shared by the core's loader and the metadata reader (~1.8 s each)."""
    import gguf  # shared's one third-party exception, here so importing shared never loads it

    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable GGUF file: {e}") from e

"""numba's cache folder is keyed on the kernels' source (an edited callee never loads stale code)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import enginecore.kernels as kernels
from enginecore.kernels import panels


def test_a_cached_kernel_lives_in_the_folder_of_this_source() -> None:
    folder = Path(os.environ["NUMBA_CACHE_DIR"])
    assert folder.name == kernels.source_hash()
    cache_path = Path(panels.int_matmul._cache._cache_path)
    assert folder in cache_path.parents


def test_the_key_is_added_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = kernels.source_hash()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert kernels.keyed_cache_dir(key) == str(tmp_path / key)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / key))  # a child of a keyed process
    assert kernels.keyed_cache_dir(key) == str(tmp_path / key)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert kernels.keyed_cache_dir(key) == str(Path.home() / ".cache/tl-serve/numba" / key)


def test_the_key_follows_every_kernel_file() -> None:
    files = sorted(Path(kernels.__file__).parent.glob("*.py"))
    assert len(files) > 5
    # what the shell prints for `cat enginecore/kernels/*.py | sha1sum`
    assert (
        kernels.source_hash()
        == hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    )

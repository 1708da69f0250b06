"""numba's cache folder is keyed on the kernels' source (an edited callee never loads stale code),
and a kernel loaded from it computes the same bits as the one compiled."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import enginecore.kernels as kernels
from enginecore.kernels import panels

REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_a_compiled_and_a_cache_loaded_kernel_give_the_same_bits(tmp_path: Path) -> None:
    # The first child compiles the kernels into an empty cache, the second loads them. With
    # LLVM free to reorder float sums (fastmath=True), they differed: paged_attention's
    # softmax sum by an ulp (kernels/ops.py, FAST)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    digests = [
        subprocess.run(
            [sys.executable, "-m", "tests.fixtures.kernel_digest_child"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True,
        ).stdout.strip()
        for _ in range(2)
    ]  # fmt: skip
    assert len(digests[0]) == 64
    assert digests[0] == digests[1]


_LAYER_LIST_CHILD = """
import numpy as np
from numba.core import event
from enginecore.kernels.layer import layer_list
with event.install_recorder("numba:compile") as recorder:
    layer_list([(np.zeros(3, np.float32), np.zeros((2, 2), np.int8))] * 4)
print(len(recorder.buffer))
"""


def test_the_layer_list_is_built_from_the_cache_in_a_second_process(tmp_path: Path) -> None:
    # a typed List built in Python compiles the List's methods in every process (~1 s of a
    # core's start); built by cached functions, a second process compiles nothing
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    compiles = [
        int(
            subprocess.run(
                [sys.executable, "-c", _LAYER_LIST_CHILD],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True,
            ).stdout.split()[-1]
        )
        for _ in range(2)
    ]  # fmt: skip
    assert compiles[0] > 0  # the first one compiled (the recorder sees compiles)
    assert compiles[1] == 0

"""Numba kernels of the forward pass.

The OpenMP threading layer comes first: its workers spin briefly between parallel regions,
which a decode step (hundreds of short regions) needs; numba's own workqueue layer sleeps
between regions and made a batch-1 decode step 5x slower (bench/README.md). Set here, before
any parallel kernel runs, rather than through NUMBA_THREADING_LAYER in the environment.

numba's on-disk cache checks only the stamp of a function's own file, never of the kernels it
calls in other files, so an edit of a callee would load stale machine code. The cache folder
is therefore keyed on the content of every file here: NUMBA_CACHE_DIR (default
~/.cache/tl-serve/numba) gets one subfolder per version of the kernels, set before any kernel
module is imported (numba reads it when a cached function is declared).
"""

import hashlib
import os
from pathlib import Path

import numba

numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]  # type: ignore[attr-defined]


def source_hash() -> str:
    """12 hex digits of the kernels' source (what `cat kernels/*.py | sha1sum` prints)."""
    digest = hashlib.sha1()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def keyed_cache_dir(key: str) -> str:
    """NUMBA_CACHE_DIR (default ~/.cache/tl-serve/numba) / key, written back to the
    environment: numba re-reads its config from there, and processes started from here inherit
    it (the key is added once). numba's own variable, not a tl-serve setting."""
    base = os.environ.get("NUMBA_CACHE_DIR") or str(Path("~/.cache/tl-serve/numba").expanduser())  # noqa: TID251
    folder = base if Path(base).name == key else str(Path(base) / key)
    os.environ["NUMBA_CACHE_DIR"] = folder  # noqa: TID251
    return folder


numba.config.CACHE_DIR = keyed_cache_dir(source_hash())  # type: ignore[attr-defined]

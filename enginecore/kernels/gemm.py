"""fp32 GEMM by OpenBLAS, called from numba's threads instead of OpenBLAS's own.

A BLAS-mode step (prefill, big batches) alternates GEMMs with numba kernels. With OpenBLAS's
thread pool beside numba's, the two pools' spinning workers fight, so every numba kernel of
such a step had to run on one thread; attention, which reads the whole KV cache, was then
single-threaded and took a third of a 64-sequence step. Here each numba thread calls a
single-threaded `cblas_sgemm` on its share of the output, so one pool does all the work:
the GEMMs run as fast as OpenBLAS's own 2-thread split and everything around them can run
in parallel too (bench/README.md).

The sgemm is numpy's own OpenBLAS (the `scipy-openblas` wheels bundle it), linked by symbol
name so the numba cache stays valid. `AVAILABLE` is False where numpy was built against
another BLAS; its callers (exact mode's many-row matmuls, long prefill chunks' attention)
then take the paths they take for few rows. Dense weights never come here (kernels/dense.py:
OpenBLAS's results depend on the batch).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from llvmlite import binding as llvm
from numba import njit, types

F32 = npt.NDArray[np.float32]

# (sgemm, set_num_threads, get_num_threads, integer type) of the scipy-openblas builds
_SYMBOLS = (
    (
        "scipy_cblas_sgemm64_",
        "scipy_openblas_set_num_threads64_",
        "scipy_openblas_get_num_threads64_",
        types.int64,
    ),
    (
        "scipy_cblas_sgemm",
        "scipy_openblas_set_num_threads",
        "scipy_openblas_get_num_threads",
        types.int32,
    ),
)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _find_openblas() -> tuple[ctypes.CDLL, tuple[str, str, str, types.Integer]] | None:
    root = Path(np.__file__).parent
    for libs in (root.parent / "numpy.libs", root / ".libs", root / ".dylibs"):
        for path in sorted(libs.glob("libscipy_openblas*")):
            lib = ctypes.CDLL(str(path))
            for names in _SYMBOLS:
                if all(hasattr(lib, name) for name in names[:3]):
                    llvm.load_library_permanently(str(path))  # numba links the symbol by name
                    return lib, names
    return None


_found = _find_openblas()
AVAILABLE = _found is not None
if _found is not None:
    _lib, (_sgemm_name, _set_name, _get_name, _int) = _found
    _set_threads = getattr(_lib, _set_name)
    _set_threads.argtypes = [ctypes.c_int]
    _get_threads = getattr(_lib, _get_name)
    _get_threads.restype = ctypes.c_int
    _DEFAULT_BLAS_THREADS = int(_get_threads())
    # every call comes from a numba thread that owns its share: OpenBLAS's pool stays idle
    _set_threads(1)
else:  # never called: the njit function below is only compiled when AVAILABLE
    _sgemm_name, _int = "cblas_sgemm", types.int32
    _DEFAULT_BLAS_THREADS = 0

_sgemm: Any = types.ExternalFunction(  # called only inside numba code
    _sgemm_name,
    types.void(
        types.int32, types.int32, types.int32, _int, _int, _int,
        types.float32, types.voidptr, _int, types.voidptr, _int,
        types.float32, types.voidptr, _int,
    ),
)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def sgemm_serial(a, b, out, b_transposed):  # pragma: no cover - compiled
    # out (m, n) = a (m, k) @ (b.T if b_transposed else b) on the calling thread, for numba
    # kernels that split their work over threads themselves; rows may be strided, elements not
    m, k = a.shape
    n = out.shape[1]
    # leading dimensions as BLAS validates them (a one-row view may carry any row stride)
    lda = max(a.strides[0] // 4, k)
    ldb = max(b.strides[0] // 4, k if b_transposed else n)
    ldc = max(out.strides[0] // 4, n)
    trans_b = _TRANS if b_transposed else _NO_TRANS
    _sgemm(
        _ROW_MAJOR, _NO_TRANS, trans_b, m, n, k, np.float32(1.0), a.ctypes.data, lda,
        b.ctypes.data, ldb, np.float32(0.0), out.ctypes.data, ldc,
    )  # fmt: skip


def openblas_core() -> str:
    """The CPU OpenBLAS chose its kernels for at load ("Haswell", "SkylakeX", ...; the
    environment's OPENBLAS_CORETYPE when set), "" when numpy uses another BLAS."""
    if not AVAILABLE:
        return ""
    name = getattr(_lib, _set_name.replace("set_num_threads", "get_corename"))
    name.restype = ctypes.c_char_p
    return bytes(name()).decode()


def openblas_threads() -> int:
    """OpenBLAS's own thread count now (0 when numpy uses another BLAS)."""
    return int(_get_threads()) if AVAILABLE else 0


@contextmanager
def numpy_blas_threads(n: int = 0) -> Iterator[None]:
    """numpy's own BLAS calls use n threads inside (0: OpenBLAS's default), one after."""
    if not AVAILABLE:
        yield
        return
    _set_threads(n or _DEFAULT_BLAS_THREADS)
    try:
        yield
    finally:
        _set_threads(1)

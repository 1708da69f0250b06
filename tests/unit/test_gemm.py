"""The OpenBLAS sgemm numba threads call, against float64 numpy: shapes with tails, the strided
views attention and exact mode's tiles pass, and numpy's own BLAS threads left as they were."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from enginecore.kernels import gemm

RNG = np.random.default_rng(77)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    tol = 1e-5 * max(k, 1) ** 0.5 * (np.abs(want).max() + 1)
    assert np.abs(got.astype(np.float64) - want).max() <= tol


def test_numpys_openblas_is_the_one_used_where_numpy_bundles_it() -> None:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert (blas["name"] == "scipy-openblas") == gemm.AVAILABLE


@njit(cache=True)
def _nt(a, b, out):
    gemm.sgemm_serial(a, b, out, True)


@njit(cache=True)
def _nn(a, b, out):
    gemm.sgemm_serial(a, b, out, False)


@njit(cache=True)
def _nt_rows(a, b, out, lo, hi):  # a row block of a and out, as a numba thread passes them
    gemm.sgemm_serial(a[lo:hi], b, out[lo:hi], True)


@njit(cache=True)
def _nt_cols(a, b, out, lo, hi):  # a column block of out
    gemm.sgemm_serial(a, b, out[:, lo:hi], True)


needs_openblas = pytest.mark.skipif(not gemm.AVAILABLE, reason="numpy's BLAS is not OpenBLAS")

SHAPES = [(1, 1, 1), (1, 960, 576), (64, 3072, 576), (512, 576, 1536), (385, 17, 63), (2, 3, 5)]


@needs_openblas
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_sgemm_nt_and_nn_equal_numpy(m: int, n: int, k: int) -> None:
    a, b = randn(m, k), randn(n, k)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    out = np.full((m, n), np.nan, np.float32)
    _nt(a, b, out)
    close(out, want, k)
    out[:] = np.nan
    _nn(a, np.ascontiguousarray(b.T), out)
    close(out, want, k)


@needs_openblas
def test_row_strided_views_as_attention_passes_them() -> None:
    # keys (ctx, n_kv, hd) gathered from the cache: one kv head is a row-strided (ctx, hd) view
    q, keys, values = randn(96, 64), randn(50, 3, 64), randn(50, 3, 64)
    s = np.empty((96, 50), np.float32)
    _nt(q, keys[:, 1], s)
    close(s, q.astype(np.float64) @ keys[:, 1].astype(np.float64).T, 64)
    o = np.empty((96, 64), np.float32)
    _nn(s, values[:, 2], o)
    close(o, s.astype(np.float64) @ values[:, 2].astype(np.float64), 50)
    # and the output can be a column block of a wider array, the rows a block of the whole
    wide = np.zeros((96, 100), np.float32)
    _nt_cols(q, keys[:, 0], wide, 10, 60)
    close(wide[:, 10:60], q.astype(np.float64) @ keys[:, 0].astype(np.float64).T, 64)
    assert not wide[:, :10].any() and not wide[:, 60:].any()
    part = np.zeros((96, 50), np.float32)
    _nt_rows(q, keys[:, 2], part, 40, 41)  # one row whose stride is its parent's
    close(part[40:41], q[40:41].astype(np.float64) @ keys[:, 2].astype(np.float64).T, 64)
    assert not part[:40].any() and not part[41:].any()


@needs_openblas
def test_numpy_blas_threads_restores_the_split_setting() -> None:
    a, b = randn(64, 64), randn(64, 64)
    assert gemm.openblas_threads() == 1  # the numba threads split the work
    with gemm.numpy_blas_threads(2):
        assert gemm.openblas_threads() == 2
        want = a @ b.T
    assert gemm.openblas_threads() == 1
    out = np.empty((64, 64), np.float32)
    _nt(a, b, out)
    close(out, want.astype(np.float64), 64)

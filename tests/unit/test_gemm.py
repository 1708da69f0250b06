"""The thread-split OpenBLAS GEMM against float64 numpy: shapes on both split sides, tails,
degenerate sizes, the strided views attention passes, one thread and two."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from enginecore.kernels import gemm, threads

RNG = np.random.default_rng(77)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    tol = 1e-5 * max(k, 1) ** 0.5 * (np.abs(want).max() + 1)
    assert np.abs(got.astype(np.float64) - want).max() <= tol


def test_numpys_openblas_is_the_one_used_where_numpy_bundles_it() -> None:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert (blas["name"] == "scipy-openblas") == gemm.AVAILABLE


# (m, n, k): n >= m splits the output columns, n < m the rows; sizes off the 16-column grain
SHAPES = [(1, 1, 1), (1, 960, 576), (9, 49152 // 64, 576), (64, 3072, 576), (512, 576, 1536),
          (384, 40, 64), (385, 17, 63), (2, 3, 5), (33, 33, 1)]  # fmt: skip


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_matmul_nt_and_nn_equal_numpy(m: int, n: int, k: int, num_threads: int) -> None:
    if num_threads > numba.config.NUMBA_NUM_THREADS:  # type: ignore[attr-defined]
        pytest.skip("one core")
    a, b = randn(m, k), randn(n, k)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    out = np.full((m, n), np.nan, np.float32)
    with threads.limited(num_threads):
        gemm.matmul_nt(a, b, out)
    close(out, want, k)
    bt = np.ascontiguousarray(b.T)
    out[:] = np.nan
    with threads.limited(num_threads):
        gemm.matmul_nn(a, bt, out)
    close(out, want, k)


def test_row_strided_views_as_attention_passes_them() -> None:
    # keys (ctx, n_kv, hd) gathered from the cache: one kv head is a row-strided (ctx, hd) view
    q, keys, values = randn(96, 64), randn(50, 3, 64), randn(50, 3, 64)
    s = np.empty((96, 50), np.float32)
    gemm.matmul_nt(q, keys[:, 1], s)
    close(s, q.astype(np.float64) @ keys[:, 1].astype(np.float64).T, 64)
    o = np.empty((96, 64), np.float32)
    gemm.matmul_nn(s, values[:, 2], o)
    close(o, s.astype(np.float64) @ values[:, 2].astype(np.float64), 50)
    # and the output can be a column block of a wider array
    wide = np.zeros((96, 100), np.float32)
    gemm.matmul_nt(q, keys[:, 0], wide[:, 10:60])
    close(wide[:, 10:60], q.astype(np.float64) @ keys[:, 0].astype(np.float64).T, 64)
    assert not wide[:, :10].any() and not wide[:, 60:].any()


def test_one_row_views_and_empty_sides() -> None:
    a, b = randn(4, 8), randn(6, 8)
    out = np.empty((1, 6), np.float32)
    gemm.matmul_nt(a[2:3], b, out)  # a one-row view whose row stride is its parent's
    close(out, a[2:3].astype(np.float64) @ b.astype(np.float64).T, 8)
    gemm.matmul_nt(np.empty((0, 8), np.float32), b, np.empty((0, 6), np.float32))
    zero_k = np.full((3, 6), np.nan, np.float32)
    gemm.matmul_nt(np.empty((3, 0), np.float32), np.empty((6, 0), np.float32), zero_k)
    assert (zero_k == 0).all()


def test_column_strided_operands_are_copied_not_misread() -> None:
    a = randn(8, 20)[:, ::2]  # elements 8 bytes apart
    b = randn(12, 10)
    out = np.empty((8, 12), np.float32)
    gemm.matmul_nt(a, b, out)
    close(out, a.astype(np.float64) @ b.astype(np.float64).T, 10)


def test_numpy_blas_threads_restores_the_split_setting() -> None:
    if not gemm.AVAILABLE:
        pytest.skip("numpy's BLAS is not the bundled OpenBLAS")
    a, b = randn(64, 64), randn(64, 64)
    assert gemm.openblas_threads() == 1  # the numba threads split the work
    with gemm.numpy_blas_threads(2):
        assert gemm.openblas_threads() == 2
        want = a @ b.T
    assert gemm.openblas_threads() == 1
    out = np.empty((64, 64), np.float32)
    gemm.matmul_nt(a, b, out)
    close(out, want.astype(np.float64), 64)

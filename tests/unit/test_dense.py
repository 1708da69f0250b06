"""The dense fp32 matmul (kernels/dense.py): each output one fma chain over k in order, so a
row's result is the same bits in a batch of any size, on any thread split and at any column."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit

from enginecore.kernels import dense, threads
from enginecore.kernels.simd import fma32
from enginecore.weights import DenseMatrix

RNG = np.random.default_rng(11)


@njit(cache=True)
def _chains(x, w, out):
    # out[r, n] = the fma chain over k, in order, of x[r, k] w[n, k]: the kernel's definition
    for r in range(x.shape[0]):
        for n in range(w.shape[0]):
            acc = np.float32(0.0)
            for k in range(x.shape[1]):
                acc = fma32(x[r, k], w[n, k], acc)
            out[r, n] = acc


def _chain_result(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    _chains(x, w, out)
    return out


@pytest.mark.parametrize(("n", "k"), [(64, 64), (70, 300), (13, 129), (1000, 96)])
def test_every_output_is_its_fma_chain(n: int, k: int) -> None:
    # widths that are whole panels, a 16-lane tail, a scalar tail, K across chunks
    w = RNG.standard_normal((n, k)).astype(np.float32)
    x = RNG.standard_normal((9, k)).astype(np.float32)
    m = DenseMatrix.pack(w)
    out = np.full((9, n + 7), np.nan, np.float32)
    m.matmul(x, out, 3)
    want = _chain_result(x, w)
    np.testing.assert_array_equal(out[:, 3 : 3 + n], want)
    assert np.isnan(out[:, :3]).all() and np.isnan(out[:, 3 + n :]).all()  # nothing else written
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(want, exact, rtol=0, atol=1e-5 * np.sqrt(k) * np.abs(exact).max())


def test_a_rows_result_does_not_depend_on_the_batch_or_the_threads() -> None:
    # OpenBLAS's sgemm fails this on AVX2 hosts (a row rounds differently in calls of 1-3 rows
    # than in calls of 4 or more), which made concurrent streams differ from serial ones
    n, k = 200, 576
    w = RNG.standard_normal((n, k)).astype(np.float32)
    x = RNG.standard_normal((40, k)).astype(np.float32)
    m = DenseMatrix.pack(w)
    alone = np.empty((40, n), np.float32)
    for r in range(40):
        m.matmul(x[r : r + 1], alone[r : r + 1])
    for rows in (2, 3, 4, 5, 8, 17, 40):
        for workers in sorted({1, numba.config.NUMBA_NUM_THREADS}):  # type: ignore[attr-defined]
            out = np.empty((rows, n), np.float32)
            with threads.limited(workers):
                m.matmul(x[:rows], out)
            np.testing.assert_array_equal(out, alone[:rows], err_msg=f"{rows} rows, {workers}")


def test_panels_hold_the_matrix_and_gather_reads_its_rows() -> None:
    w = RNG.standard_normal((45, 20)).astype(np.float32)
    m = DenseMatrix.pack(w)
    assert m.shape == (45, 20) and m.panels.shape == (2, 20, dense.PANEL)
    np.testing.assert_array_equal(m.rows(), w)
    assert not m.panels[1, :, 45 - dense.PANEL :].any()  # the padding rows are zero
    ids = np.array([44, 0, 31, 32, 44], np.int32)
    rows = np.empty((5, 20), np.float32)
    m.gather(ids, rows)
    np.testing.assert_array_equal(rows, w[ids])

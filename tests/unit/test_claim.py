"""Claimed work splits (enginecore/kernels/claim.py): every item once, a stalled worker's share
taken by the others, and the kernels that claim give the bits of a fixed split."""

from __future__ import annotations

import time

import gguf
import numba
import numpy as np
import pytest
from numba import njit, prange

from enginecore.kernels import panels, threads
from enginecore.kernels.claim import (
    counters,
    fetch_add,
    next_item,
    num_chunks,
    share,
    shares_to_claim,
)
from enginecore.loader import gguf_types
from enginecore.weights import Numerics, PackedMatrix
from tests.fixtures.quant_blocks import random_blocks

RNG = np.random.default_rng(7)
STALL_LIMIT_S = 30.0  # a stalled worker waits this long at most for the others to finish


@njit
def _now():  # type: ignore[no-untyped-def]
    with numba.objmode(t="float64"):
        t = time.monotonic()
    return t


@njit(parallel=True)
def _claims(n_chunks, workers, stalled, c, done, who):
    # every chunk records the worker that took it (who[chunk] += worker + 1); worker `stalled`
    # starts only when every other worker has left its loop (done counts them), as a thread
    # descheduled for the region would, or after STALL_LIMIT_S
    for w in prange(workers):
        if w == stalled:
            t0 = _now()
            while fetch_add(done, 0, 0) < workers - 1 and _now() - t0 < STALL_LIMIT_S:
                pass
        while True:  # the kernels' walk (int_matmul, paged_attention)
            i = next_item(c, w, n_chunks, shares_to_claim(n_chunks, workers))
            if i < 0:
                break
            who[i] += w + 1
        if w != stalled:
            fetch_add(done, 0, 1)


def run_claims(n_chunks: int, workers: int, stalled: int) -> np.ndarray:
    who = np.zeros(n_chunks, np.int64)
    _claims(n_chunks, workers, stalled, counters(workers), counters(1), who)
    return who - 1  # the worker of each chunk


@pytest.mark.parametrize("n_chunks", [2, 7, 64, 1000])
def test_every_chunk_is_claimed_once(n_chunks: int) -> None:
    # who counts worker + 1 per claim: a chunk taken twice or never would not be a worker id
    for stalled in (-1, 0, 1):
        who = run_claims(n_chunks, 2, stalled)
        assert set(who.tolist()) <= {0, 1}


@pytest.mark.skipif(numba.get_num_threads() < 2, reason="needs two numba threads")
def test_a_stalled_worker_s_share_is_taken_by_the_other() -> None:
    # worker 1 starts only after worker 0 has left its loop: worker 0 did every chunk
    who = run_claims(64, 2, stalled=1)
    np.testing.assert_array_equal(who, 0)
    who = run_claims(64, 2, stalled=0)
    np.testing.assert_array_equal(who, 1)


def test_undisturbed_workers_walk_their_own_share_in_order() -> None:
    # one chunk per worker: no claims across shares (shares_to_claim is 1), a fixed split
    assert shares_to_claim(2, 2) == 1 and shares_to_claim(3, 2) == 2
    who = run_claims(2, 2, stalled=-1)
    np.testing.assert_array_equal(who, [0, 1])


def test_chunk_counts() -> None:
    # little work in all: one chunk per worker; else a multiple of the workers, each chunk at
    # least min_chunk_work, never more chunks than items
    assert num_chunks(60, 2, 9216, 1 << 16, 1 << 22) == 2
    assert num_chunks(3072, 2, 9216, 1 << 16, 1 << 22) == 2 * (3072 * 9216 // (2 << 16))
    assert num_chunks(60, 2, 16 * 576 * 64, 1 << 16, 1 << 22) == 60
    assert num_chunks(61, 2, 16 * 576 * 64, 1 << 16, 1 << 22) == 60
    assert num_chunks(1, 2, 1 << 30, 1 << 16, 1 << 22) == 1
    for n, workers in ((5, 2), (100, 3), (7, 7)):
        for s in range(workers):
            first, end = share(s, n, workers)
            assert first == s * n // workers and end == (s + 1) * n // workers


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0])
def test_a_claimed_matmul_gives_the_bits_of_one_thread(qtype: gguf.GGMLQuantizationType) -> None:
    # 40 panels x 64 rows x K 256: more multiply-adds than CLAIMED_MACS, so two workers
    # claim single panels across shares; one thread walks them all in order
    n_out, k, rows = 40 * 16, 256, 64
    assert n_out * k * rows >= panels.CLAIMED_MACS
    raw = random_blocks(qtype, n_out, k, RNG)
    m = PackedMatrix.pack(qtype.name, gguf_types.decode(qtype, raw), Numerics.INT16)
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    two = np.full((rows, n_out), np.nan, np.float32)
    m.matmul(x, two)
    one = np.full((rows, n_out), np.nan, np.float32)
    with threads.limited(1):
        m.matmul(x, one)
    assert not np.isnan(two).any()
    np.testing.assert_array_equal(two.view(np.uint32), one.view(np.uint32))

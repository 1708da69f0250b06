"""Work handed out while a parallel region runs: each worker claims its items as it goes.

A parallel region ends when its last worker does. The core's compute threads share two cores
with the frontend, the HTTP clients and the rest of the machine, so one of them is often
descheduled for a while in the middle of a region; with a fixed share per worker the other
finishes its share and spins at the region's end until the first is back (a neighbour that
took 9% of a core made whole decode steps 10-11% slower: bench/README.md).

Here the items are split into one contiguous share per worker, as a fixed split would, but
each share has a counter, and a worker claims the items of its share one by one; when its
share is empty it claims what is left of the next share, and so on. Undisturbed, each worker
walks its own share in order, with its own counter in its own cache line (a claim costs an
uncontended atomic add, and neighbouring items, which may write neighbouring memory, go to
the same worker); when one worker is descheduled, the other takes its unstarted items.

    c = counters(workers)                      # before the region
    for w in prange(workers):
        while True:
            i = next_item(c, w, n, shares_to_claim(n, workers))
            if i < 0:
                break
            ...item i...

A short region (a one-row matmul of a small matrix, a decode's attention for a few tokens)
keeps a fixed split, and no worker claims from another's share: such a region lasts 5-20 us,
and a claim across shares moves a cache line between cores. (The first version, with claims
everywhere and its counters made inside the parallel function, made one-row matmuls of the
layer matrices 15-35% slower; most of that was the array made inside, ~1.7 us a region, so
every kernel here takes its arrays from a caller outside the parallel function. With that
done, claims in short regions too measured neutral at B=1 and 4, quiet or beside a busy
neighbour, so the fixed split stays there.)

Which worker computes an item never changes what the item computes, so a claimed split gives
the same bits as a fixed one.
"""

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# a share's counter is element COUNTER_SLOT of its row of 2 * COUNTER_SLOT int64 (128 bytes):
# whatever the array's 16-byte-aligned start, that element's cache line holds nothing but its
# own row's bytes, so two shares' counters never share a line. Element SHARES_DONE of row w
# is worker w's own (how many shares it has emptied), 64 bytes from any counter.
COUNTER_SLOT = 8
SHARES_DONE = 0


def _fetch_add(ordering: str) -> Any:
    def typer(typingctx: Any, c: Any, s: Any, n: Any) -> Any:
        """c[s, COUNTER_SLOT] += n atomically; the value before (int64). n = 0 reads it."""
        if not (isinstance(c, types.Array) and c.dtype == types.int64 and c.ndim == 2):
            return None
        if not (isinstance(s, types.Integer) and isinstance(n, types.Integer)):
            return None

        def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
            i64 = ir.IntType(64)
            arr = context.make_array(sig.args[0])(context, b, args[0])
            row, add = (
                context.cast(b, v, t, types.int64)
                for v, t in zip(args[1:], sig.args[1:], strict=True)
            )
            at = b.add(
                b.mul(row, ir.Constant(i64, 2 * COUNTER_SLOT)), ir.Constant(i64, COUNTER_SLOT)
            )
            return b.atomic_rmw("add", b.gep(arr.data, [at]), add, ordering)

        return types.int64(c, s, n), codegen

    return intrinsic(typer)


# monotonic: a claim's counter alone needs no order; the region's end orders the results
fetch_add: Any = _fetch_add("monotonic")
# acq_rel: what a worker wrote before adding is seen by a worker that reads the sum after
# (counting finished items, so that a worker waits for a phase's items rather than for the
# other worker: done_wait)
sync_add: Any = _fetch_add("acq_rel")


@njit(cache=True, nogil=True, inline="always")
def done_wait(c, n_items):
    # spin until c's counter 0 has counted n_items finished items (each sync_add(c, 0, 1)
    # after its item's writes). Items are claimed from every share, so a worker that waits
    # has claimed all it could: the rest are being finished by the others, and a lone worker
    # (both prange iterations on one thread) finishes them all before it gets here
    while sync_add(c, 0, 0) < n_items:
        pass


@njit(cache=True, nogil=True, inline="always")
def counters(workers):
    # one counter per share, all at 0: made before the region (outside prange), shared by it
    return np.zeros((workers, 2 * COUNTER_SLOT), np.int64)


@njit(cache=True, nogil=True, inline="always")
def claim(c, s):
    # the next unclaimed index of share s (0, 1, 2, ... across all workers, each once)
    return fetch_add(c, s, 1)


@njit(cache=True, nogil=True, inline="always")
def next_item(c, w, n_items, n_shares):
    # worker w's next item of n_items (split into c.shape[0] shares), or -1 when none is left:
    # from its own share, then from the next n_shares - 1 shares in turn
    workers = c.shape[0]
    while c[w, SHARES_DONE] < n_shares:
        s = (w + c[w, SHARES_DONE]) % workers
        first, end = share(s, n_items, workers)
        i = first + claim(c, s)
        if i < end:
            return i
        c[w, SHARES_DONE] += 1
    return -1


@njit(cache=True, nogil=True, inline="always")
def share(s, n_items, workers):
    # items [first, end) of share s of n_items split evenly among workers
    return s * n_items // workers, (s + 1) * n_items // workers


@njit(cache=True, nogil=True, inline="always")
def num_chunks(n_items, workers, item_work, min_chunk_work, min_claimed_work):
    # how many even chunks to cut n_items of item_work each into: one per worker (a fixed
    # split: no claims across shares) when all of it is under min_claimed_work; else a
    # multiple of workers, each of at least min_chunk_work where there are enough items, at
    # most one item each
    work = n_items * item_work
    if work < min_claimed_work or n_items <= workers:
        return min(n_items, workers)
    per_worker = max(min(n_items // workers, work // (min_chunk_work * workers)), 1)
    return workers * per_worker


@njit(cache=True, nogil=True, inline="always")
def shares_to_claim(n_chunks, workers):
    # how many shares a worker claims from, its own first: all of them when the region is
    # cut finer than one chunk a worker, else only its own
    return workers if n_chunks > workers else 1

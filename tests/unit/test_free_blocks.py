"""FreeBlocks: every id handed out once, and tables that grow in lockstep stay contiguous."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from enginecore.block_manager import BlockManager
from enginecore.free_blocks import FreeBlocks


def jumps(table: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(table) if b != a + 1)


def test_tables_growing_in_lockstep_stay_contiguous() -> None:
    """64 decodes that each cross into a new block on the same step, as a busy batch does."""
    bm = BlockManager(728, 32, prefix_cache=True)
    rids = [f"r{s}" for s in range(64)]
    assert all(bm.allocate(rid, [100 + s] * 32, 1) is not None for s, rid in enumerate(rids))
    for num_tokens in range(34, 34 + 128):
        for rid in rids:
            assert bm.append_slots(rid, num_tokens)
    assert [jumps(bm.table(rid)) for rid in rids] == [0] * 64
    bm.check_integrity()


def test_a_block_without_a_free_successor_comes_from_the_middle_of_the_largest_run() -> None:
    free = FreeBlocks(20)
    assert free.take(3, None) == [10, 11, 12]  # the middle of 0..19
    assert free.take(2, 12) == [13, 14]  # continues after 12
    assert free.take(1, 4) == [5]
    # runs now 0..4, 6..9, 15..19: block 5's successor 6 is free, 9's (10) is not
    assert free.take(1, 9) == [2]  # middle of the largest run, 0..4
    free.put(10)
    assert free.take(2, 9) == [10, 17]  # 10 is back; 11 is not free: middle of 15..19
    assert list(free) == [0, 1, 3, 4, 6, 7, 8, 9, 15, 16, 18, 19]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(-1, 40)), max_size=60))
def test_every_id_is_free_or_taken_exactly_once(ops: list[tuple[bool, int, int]]) -> None:
    free, taken = FreeBlocks(40), []
    for is_take, n, after in ops:
        if is_take:
            got = free.take(min(n, len(free)), None if after < 0 else after)
            taken.extend(got)
        elif taken:
            free.put(taken.pop(n % len(taken)))
        assert list(free) == sorted(free)
        assert sorted([*free, *taken]) == list(range(40))

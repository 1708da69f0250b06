"""RadixCache: unit behaviour plus a stateful test against a naive dict-of-prefixes model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from enginecore.radix_cache import MatchResult, PartialHit, RadixCache


def test_empty_cache_matches_nothing() -> None:
    cache = RadixCache(block_size=2)
    assert cache.match([1, 2, 3, 4]) == MatchResult([], 0)
    assert cache.evict(3) == []
    cache.check_integrity()


def test_match_returns_longest_whole_block_prefix() -> None:
    cache = RadixCache(block_size=2)
    assert cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == [10, 11, 12]
    assert cache.match([1, 2, 3, 4, 5, 6, 7]) == MatchResult([10, 11, 12], 6)
    assert cache.match([1, 2, 3, 9, 5, 6]) == MatchResult([10], 2)
    assert cache.match([1, 2, 3]) == MatchResult([10], 2)  # the partial tail never matches
    assert cache.match([2, 1]) == MatchResult([], 0)
    assert cache.match([1, 2, 3, 4, 5, 6], max_blocks=2) == MatchResult([10, 11], 4)
    assert cache.match([1, 2, 3, 4, 5, 6], max_blocks=0) == MatchResult([], 0)
    cache.check_integrity()


def test_insert_keeps_existing_blocks_and_branches() -> None:
    cache = RadixCache(block_size=2)
    cache.insert([1, 2, 3, 4], [10, 11])
    # same first block, different second: the tree keeps 10 and adopts 21 as a sibling of 11
    assert cache.insert([1, 2, 5, 6], [20, 21]) == [10, 21]
    assert cache.num_cached == 3
    assert cache.match([1, 2, 5, 6]) == MatchResult([10, 21], 4)
    assert cache.match([1, 2, 3, 4]) == MatchResult([10, 11], 4)
    assert 20 not in cache
    cache.check_integrity()


def test_each_salt_has_its_own_tree_while_it_holds_blocks() -> None:
    cache = RadixCache(block_size=2)
    assert cache.insert([1, 2, 3, 4], [10, 11], salt="a") == [10, 11]
    assert cache.insert([1, 2, 3, 4], [20, 21]) == [20, 21]  # not a duplicate: another tree
    assert cache.match([1, 2, 3, 4], salt="a") == MatchResult([10, 11], 4)
    assert cache.match([1, 2, 3, 4]) == MatchResult([20, 21], 4)
    assert cache.match([1, 2, 3, 4], salt="b") == MatchResult([], 0)
    cache.check_integrity()
    assert sorted(cache.evict(4)) == [10, 11, 20, 21]
    cache.check_integrity()  # the emptied salted tree went with its last block
    assert cache.insert([1, 2], [30], salt="a") == [30]
    cache.check_integrity()


def test_ref_counts_and_evictable_counter() -> None:
    cache = RadixCache(block_size=1)
    cache.insert([1, 2], [5, 6])
    assert cache.num_evictable == 2
    cache.lock([5, 6])
    cache.lock([5])
    assert (cache.ref_count(5), cache.ref_count(6)) == (2, 1)
    assert (cache.num_evictable, cache.num_locked) == (0, 2)
    cache.unlock([5, 6])
    assert (cache.num_evictable, cache.num_locked) == (1, 1)
    cache.check_integrity()


def test_locked_blocks_are_never_evicted() -> None:
    cache = RadixCache(block_size=1)
    cache.insert([1, 2, 3], [5, 6, 7])
    cache.lock([5, 6])
    assert cache.evict(10) == [7]
    assert cache.num_cached == 2
    cache.unlock([5, 6])
    assert cache.evict(10) == [6, 5]  # leaves first: the child goes before its parent
    cache.check_integrity()


def test_evicts_least_recently_used_leaf_first() -> None:
    cache = RadixCache(block_size=1)
    cache.insert([1], [10])
    cache.insert([2], [20])
    cache.insert([3], [30])
    cache.lock([10])  # touching 10 makes it the most recent
    cache.unlock([10])
    assert cache.evict(1) == [20]
    assert cache.evict(1) == [30]
    assert cache.evict(1) == [10]
    cache.check_integrity()


def test_parent_becomes_evictable_after_its_children() -> None:
    cache = RadixCache(block_size=1)
    cache.insert([1, 2], [10, 11])
    cache.insert([9], [90])
    cache.lock([90])
    cache.unlock([90])  # 90 is newer than 10 and 11
    assert cache.evict(2) == [11, 10]
    assert cache.match([1]) == MatchResult([], 0)
    cache.check_integrity()


def test_a_partial_hit_is_the_child_sharing_the_most_next_tokens() -> None:
    cache = RadixCache(block_size=4)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 11])
    cache.insert([1, 2, 3, 4, 5, 6, 9, 9], [10, 12])
    cache.insert([1, 2, 3, 4, 2, 2, 2, 2], [10, 13])
    tokens = [1, 2, 3, 4, 5, 6, 7, 0, 0]
    match = cache.match(tokens)
    assert match == MatchResult([10], 4)
    assert cache.match_partial(tokens, match, len(tokens)) == PartialHit(11, 3)
    assert cache.match_partial(tokens, match, 6) == PartialHit(11, 2)  # up to position 6
    assert cache.match_partial(tokens, match, 4) is None  # no next token allowed
    assert cache.match_partial([1, 2, 3, 4, 3], match, 5) is None  # no child starts with 3
    # a whole block past the limit is a partial hit of all but the excluded tokens
    full = [1, 2, 3, 4, 5, 6, 7, 8]
    assert cache.match_partial(full, cache.match(full, 1), 7) == PartialHit(11, 3)
    root = cache.match([1, 2, 9])
    assert cache.match_partial([1, 2, 9], root, 3) == PartialHit(10, 2)
    assert cache.match_partial([1, 2, 9], root, 3, salt="other") is None
    assert cache.evict(1) in ([11], [12], [13])
    cache.check_integrity()  # sorted keys follow evictions


def test_check_integrity_catches_a_child_referenced_without_its_parent() -> None:
    cache = RadixCache(block_size=1)
    cache.insert([1, 2], [10, 11])
    cache.lock([11])
    with pytest.raises(AssertionError):
        cache.check_integrity()


class RadixModel(RuleBasedStateMachine):
    """Compares RadixCache with a dict from block-aligned prefixes to blocks, scanned naively."""

    def __init__(self) -> None:
        super().__init__()
        self.bs = 2
        self.cache = RadixCache(self.bs)
        self.blocks: dict[tuple[int, ...], int] = {}  # prefix (whole blocks) -> block_id
        self.ref: dict[int, int] = {}
        self.time: dict[int, int] = {}
        self.clock = 0
        self.next_id = 0
        self.locked: list[list[int]] = []

    def _path(self, tokens: list[int]) -> list[tuple[int, ...]]:
        return [tuple(tokens[: (k + 1) * self.bs]) for k in range(len(tokens) // self.bs)]

    @rule(tokens=st.lists(st.integers(0, 2), max_size=8), max_blocks=st.none() | st.integers(0, 4))
    def match(self, tokens: list[int], max_blocks: int | None) -> None:
        expected: list[int] = []
        for prefix in self._path(tokens)[:max_blocks]:
            if prefix not in self.blocks:
                break
            expected.append(self.blocks[prefix])
        assert self.cache.match(tokens, max_blocks) == MatchResult(expected, len(expected) * 2)

    @rule(tokens=st.lists(st.integers(0, 2), max_size=8), max_tokens=st.integers(0, 8))
    def match_partial(self, tokens: list[int], max_tokens: int) -> None:
        match = self.cache.match(tokens, max_tokens // self.bs)
        start = match.num_tokens
        query = tokens[start : min(start + self.bs, max_tokens)]
        # every cached block continuing the match, by the tokens it shares with the query
        shared = {}
        for prefix, block_id in self.blocks.items():
            if len(prefix) == start + self.bs and list(prefix[:start]) == tokens[:start]:
                key, n = prefix[start:], 0
                while n < len(query) and key[n] == query[n]:
                    n += 1
                shared[block_id] = n
        best = min(max(shared.values(), default=0), self.bs - 1)
        hit = self.cache.match_partial(tokens, match, max_tokens)
        if best == 0:
            assert hit is None
        else:
            assert hit is not None and hit.num_tokens == best
            assert min(shared[hit.block_id], self.bs - 1) == best

    @rule(tokens=st.lists(st.integers(0, 2), min_size=2, max_size=8))
    def insert(self, tokens: list[int]) -> None:
        self.clock += 1
        given = list(range(self.next_id, self.next_id + len(tokens) // self.bs))
        self.next_id += len(given)
        expected = []
        for prefix, block_id in zip(self._path(tokens), given, strict=True):
            if prefix not in self.blocks:
                self.blocks[prefix] = block_id
                self.ref[block_id] = 0
                self.time[block_id] = self.clock
            expected.append(self.blocks[prefix])
        assert self.cache.insert(tokens, given) == expected

    @precondition(lambda self: self.blocks)
    @rule(i=st.integers(0, 10_000))
    def lock_a_path(self, i: int) -> None:
        target = sorted(self.blocks)[i % len(self.blocks)]
        path = [self.blocks[target[:end]] for end in range(self.bs, len(target) + 1, self.bs)]
        self.clock += 1
        for block_id in path:
            self.ref[block_id] += 1
            self.time[block_id] = self.clock
        self.cache.lock(path)
        self.locked.append(path)

    @precondition(lambda self: self.locked)
    @rule(i=st.integers(0, 10_000))
    def unlock_a_path(self, i: int) -> None:
        path = self.locked.pop(i % len(self.locked))
        self.clock += 1
        for block_id in path:
            self.ref[block_id] -= 1
            self.time[block_id] = self.clock
        self.cache.unlock(path)

    @rule(n=st.integers(0, 5))
    def evict(self, n: int) -> None:
        expected = []
        for _ in range(n):
            leaves = [
                (self.time[b], b, p)
                for p, b in self.blocks.items()
                if self.ref[b] == 0
                and not any(len(q) > len(p) and q[: len(p)] == p for q in self.blocks)
            ]
            if not leaves:
                break
            _, block_id, prefix = min(leaves)
            del self.blocks[prefix]
            expected.append(block_id)
        assert self.cache.evict(n) == expected

    @invariant()
    def agrees_with_model(self) -> None:
        self.cache.check_integrity()
        assert self.cache.num_cached == len(self.blocks)
        assert self.cache.num_evictable == sum(self.ref[b] == 0 for b in self.blocks.values())
        for block_id in self.blocks.values():
            assert self.cache.ref_count(block_id) == self.ref[block_id]


TestRadixModel = RadixModel.TestCase
TestRadixModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

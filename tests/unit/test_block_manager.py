"""BlockManager: unit behaviour plus a stateful test that tracks what each block holds."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from enginecore.block_manager import BlockManager


def run(bm: BlockManager, rid: str, tokens: list[int]) -> list[int]:
    """Admit, compute every token, publish; return (a copy of) the live block table."""
    assert bm.allocate(rid, tokens) is not None
    bm.take_copies()  # a partial hit's copy, made by the runner before the forward
    bm.cache_full_blocks(rid, tokens)
    bm.check_integrity()
    return list(bm.table(rid))


def test_second_request_shares_the_published_prefix() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, prefix_cache=True)
    a = run(bm, "a", list(range(10)))  # 2 full blocks + a tail of 2
    assert bm.allocate("b", [*range(8), 50, 51, 52]) == 8
    assert bm.table("b")[:2] == a[:2]
    assert bm.table("b")[2] not in a
    assert bm.num_used == 4  # 3 for a, 1 more for b
    assert bm.cache.ref_count(a[0]) == 2
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (21, 8)
    bm.check_integrity()


def test_partial_tail_is_never_shared_and_one_token_is_left_to_compute() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, prefix_cache=True)
    run(bm, "a", [1, 2, 3, 4, 5, 6])
    bm.free("a", [1, 2, 3, 4, 5, 6])
    assert bm.table("a") == []  # free drops the table
    assert not bm.has("a")
    assert (bm.num_free, bm.num_cached, bm.num_used) == (7, 1, 0)
    assert bm.allocate("a2", [1, 2, 3, 4, 5, 6]) == 4  # the unpublished tail is gone
    assert bm.take_copies() == []
    b = run(bm, "b", [9, 9, 9, 9, 8, 8, 8, 8])
    bm.free("b", [9, 9, 9, 9, 8, 8, 8, 8])
    # whole prompt cached: its last block is a partial hit of all but the last token
    assert bm.allocate("b2", [9, 9, 9, 9, 8, 8, 8, 8]) == 7
    assert bm.table("b2")[0] == b[0] and bm.table("b2")[1] != b[1]
    assert bm.take_copies() == [(b[1], bm.table("b2")[1])]
    assert bm.take_copies() == []  # taken once
    bm.check_integrity()


def test_a_partial_hit_takes_the_cached_block_sharing_the_most_next_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=True)
    tables = {}
    for rid, tokens in (("a", [5, 1, 2, 3]), ("b", [5, 1, 7, 7]), ("c", [5, 2, 2, 2])):
        tables[rid] = run(bm, rid, tokens)
        bm.free(rid, tokens)
    assert bm.allocate("d", [5, 1, 2, 9, 9]) == 3  # a's first 3 tokens
    assert bm.take_copies() == [(tables["a"][0], bm.table("d")[0])]
    assert bm.allocate("e", [5, 1, 9]) == 2  # a's and b's first 2 tie: either serves
    [(src, dst)] = bm.take_copies()
    assert src in (tables["a"][0], tables["b"][0]) and dst == bm.table("e")[0]
    assert bm.allocate("f", [6, 5, 1]) == 0 and bm.take_copies() == []
    assert bm.allocate("g", [5, 1, 2], salt="s") == 0  # another salt's tree
    assert bm.allocate("h", [5, 1, 2, 3], match_prefix=False) == 0
    assert bm.take_copies() == []
    # hits: b 2 and c 1 tokens (of a's block), d 3, e 2
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (12 + 5 + 3 + 3 + 3, 8)
    bm.check_integrity()


def test_a_fork_shares_published_blocks_and_copies_the_rest() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=True)
    parent = run(bm, "p", list(range(10)))  # blocks 0-1 published, block 2 holds 8, 9
    copies = bm.fork("p", "c", 10)  # the KV of positions 0..9, room for position 10
    assert copies is not None
    child = bm.table("c")
    assert child[:2] == parent[:2] and bm.cache.ref_count(parent[0]) == 2
    assert copies == [(parent[2], child[2])] and len(child) == 3
    bm.check_integrity()
    # a fork ending on a block boundary copies nothing: its next position opens a new block
    assert bm.fork("p", "c2", 8) == [] and len(bm.table("c2")) == 3
    # the block of the child's next position is never shared, even when published
    copies = bm.fork("p", "c3", 7)
    assert copies == [(parent[1], bm.table("c3")[1])]
    bm.check_integrity()
    for rid in ("c", "c2", "c3", "p"):
        bm.free(rid, [])
    assert bm.num_used == 0
    bm.check_integrity()


def test_a_fork_without_a_prefix_cache_copies_everything_and_may_find_no_room() -> None:
    bm = BlockManager(num_blocks=6, block_size=4, prefix_cache=False)
    parent = run(bm, "p", list(range(10)))
    copies = bm.fork("p", "c", 10)
    assert copies is not None and [src for src, _ in copies] == parent
    assert bm.fork("p", "d", 10) is None  # no block left, 3 needed: nothing changes
    assert not bm.has("d")
    bm.check_integrity()


def test_cache_salts_keep_prefixes_apart_and_scoring_skips_the_cache() -> None:
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=True)
    tokens = list(range(9))
    for rid, salt in (("a", "s1"), ("b", "")):
        assert bm.allocate(rid, tokens, salt=salt) == 0
        bm.cache_full_blocks(rid, tokens)
    assert bm.allocate("c", tokens, salt="s1") == 8
    assert bm.allocate("d", tokens, salt="s2") == 0
    assert bm.allocate("e", tokens, match_prefix=False) == 0
    bm.check_integrity()
    for rid in "abcde":
        bm.free(rid, [])
    assert bm.allocate("f", list(range(100, 164))) is not None  # all 16 blocks: no cache left
    assert bm.cache.match(tokens, salt="s1").num_tokens == 0
    bm.check_integrity()  # the emptied salted tree is gone


def test_lru_cached_blocks_are_evicted_first_and_counted() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, prefix_cache=True)
    old, new = [1, 1, 1, 1], [2, 2, 2, 2]
    for rid, tokens in (("old", old), ("new", new)):
        run(bm, rid, tokens)
        bm.free(rid, tokens)
    assert (bm.num_free, bm.num_cached) == (0, 4)
    assert bm.allocate("c", [3, 3, 3]) is not None  # needs 2 blocks: both of `old` go, leaf first
    assert bm.evictions_total == 2
    assert bm.cache.match(old).num_tokens == 0
    assert bm.cache.match(new).num_tokens == 4
    bm.check_integrity()


def test_referenced_blocks_are_never_evicted() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, prefix_cache=True)
    run(bm, "running", [1, 2, 3, 4, 5])  # 3 blocks, 2 published and locked
    assert bm.allocate("new", [7, 7, 7]) is None  # needs 2, only 1 free, nothing evictable
    assert not bm.has("new")
    assert (bm.num_free, bm.num_cached, bm.num_used, bm.evictions_total) == (1, 0, 3, 0)
    assert not bm.append_slots("running", 9)
    assert len(bm.table("running")) == 3
    assert bm.append_slots("running", 8)
    assert len(bm.table("running")) == 4
    bm.check_integrity()


def test_none_mode_never_caches() -> None:
    bm = BlockManager(num_blocks=6, block_size=2, prefix_cache=False)
    tokens = [1, 2, 3, 4, 5, 6]
    a = run(bm, "a", tokens)
    assert bm.cache.num_cached == 0
    assert bm.allocate("b", tokens) == 0
    assert not set(a) & set(bm.table("b"))
    bm.free("a", tokens)
    bm.free("b", tokens)
    assert (bm.num_free, bm.num_cached, bm.num_used) == (6, 0, 0)
    assert bm.prefix_hit_tokens == 0
    bm.check_integrity()


def test_duplicate_computed_blocks_are_swapped_for_the_cached_copy() -> None:
    bm = BlockManager(num_blocks=8, block_size=2, prefix_cache=True)
    tokens = [4, 4, 5, 5, 6]
    assert bm.allocate("a", tokens) == 0
    assert bm.allocate("b", tokens) == 0  # admitted together: no hit for b
    bm.cache_full_blocks("a", tokens)
    b_tail = bm.table("b")[2]
    bm.cache_full_blocks("b", tokens)
    assert bm.table("b")[:2] == bm.table("a")[:2]
    assert bm.table("b")[2] == b_tail  # the private tail is untouched
    assert (bm.num_used, bm.num_free) == (4, 4)  # b's two duplicates went back to free
    bm.check_integrity()
    bm.free("a", tokens)
    bm.free("b", tokens)
    assert (bm.num_free, bm.num_cached, bm.num_used) == (6, 2, 0)
    bm.check_integrity()


def test_chunked_allocation_and_free_of_unallocated_table() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, prefix_cache=True)
    assert bm.allocate("a", list(range(20)), max_new_tokens=5) is not None
    assert len(bm.table("a")) == 2
    assert bm.can_allocate(24)
    assert not bm.can_allocate(25)
    bm.free("never", [])  # a request aborted before admission
    bm.free("a", [])  # aborted before computing anything: nothing published
    assert (bm.num_free, bm.num_cached) == (8, 0)
    bm.check_integrity()


def test_scratch_tables_are_private_and_freed() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, prefix_cache=True)
    table = bm.allocate_scratch("embed:x", 5)
    assert table is not None and len(table) == 3
    assert bm.has("embed:x") and bm.num_used == 3
    assert bm.allocate_scratch("embed:y", 3) is None  # one block left
    bm.free("embed:x", [])
    assert (bm.num_free, bm.num_cached, bm.num_used) == (4, 0, 0)
    bm.check_integrity()


@dataclass
class Seq:
    rid: str
    tokens: list[int]
    computed: int
    published: int  # blocks the model expects to be in the tree


class BlockManagerModel(RuleBasedStateMachine):
    """Random admit/compute/publish/grow/free/abort with colliding prompts and a tiny pool."""

    @initialize(bs=st.sampled_from([1, 2, 4]), num_blocks=st.integers(3, 10), cache=st.booleans())
    def setup(self, bs: int, num_blocks: int, cache: bool) -> None:
        self.bs, self.num_blocks, self.caching = bs, num_blocks, cache
        self.bm = BlockManager(num_blocks, bs, prefix_cache=cache)
        self.content: dict[int, list[int | None]] = {}  # block_id -> tokens written into it
        self.live: list[Seq] = []
        self.admitted = 0

    def _guaranteed_hit(self, tokens: list[int]) -> int:
        """Blocks of `tokens` surely cached: prefixes published by live (so locked) sequences."""
        held = {
            tuple(s.tokens[: k * self.bs]) for s in self.live for k in range(1, s.published + 1)
        }
        cap = (len(tokens) - 1) // self.bs
        return max((k for k in range(cap + 1) if tuple(tokens[: k * self.bs]) in held), default=0)

    @rule(
        tokens=st.lists(st.integers(0, 1), min_size=1, max_size=10),
        chunk=st.none() | st.integers(1, 6),
    )
    def admit(self, tokens: list[int], chunk: int | None) -> None:
        before = (self.bm.num_free, self.bm.num_cached, self.bm.num_used)
        lower = self._guaranteed_hit(tokens) if self.caching else 0
        rid = f"r{self.admitted}"
        self.admitted += 1
        cached = self.bm.allocate(rid, tokens, chunk)
        if cached is None:
            assert self.bm.blocks_needed(len(tokens)) > before[0] + before[1]
            assert (self.bm.num_free, self.bm.num_cached, self.bm.num_used) == before
            return
        assert lower * self.bs <= cached <= len(tokens) - 1
        assert self.caching or cached == 0
        todo = len(tokens) - cached if chunk is None else min(chunk, len(tokens) - cached)
        assert len(self.bm.table(rid)) == self.bm.blocks_needed(cached + todo)
        copies = self.bm.take_copies()  # a partial hit: copied as the runner would
        assert len(copies) == (cached % self.bs > 0)
        for src, dst in copies:
            assert dst == self.bm.table(rid)[cached // self.bs]
            self.content[dst] = list(self.content[src])
        self.live.append(Seq(rid, list(tokens), cached, cached // self.bs))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), n=st.integers(1, 6))
    def compute(self, i: int, n: int) -> None:
        seq = self.live[i % len(self.live)]
        n = min(n, len(seq.tokens) - seq.computed)
        table = self.bm.table(seq.rid)
        free_before, cached_before, old_len = self.bm.num_free, self.bm.num_cached, len(table)
        if not self.bm.append_slots(seq.rid, seq.computed + n):
            assert self.bm.blocks_needed(seq.computed + n) - old_len > free_before + cached_before
            assert len(self.bm.table(seq.rid)) == old_len
            return
        table = self.bm.table(seq.rid)
        others = {b for s in self.live if s is not seq for b in self.bm.table(s.rid)}
        for pos in range(seq.computed, seq.computed + n):
            block_id = table[pos // self.bs]
            assert block_id not in others, "writing a block another sequence uses"
            assert block_id not in self.bm.cache, "writing a cached block"
            self.content.setdefault(block_id, [None] * self.bs)[pos % self.bs] = seq.tokens[pos]
        seq.computed += n

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), new=st.lists(st.integers(0, 1), min_size=1, max_size=3))
    def extend(self, i: int, new: list[int]) -> None:
        self.live[i % len(self.live)].tokens.extend(new)  # sampled tokens, not computed yet

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def publish(self, i: int) -> None:
        seq = self.live[i % len(self.live)]
        self.bm.cache_full_blocks(seq.rid, seq.tokens[: seq.computed])
        if self.caching:
            num_blocks = len(self.bm.table(seq.rid))
            seq.published = max(seq.published, min(seq.computed // self.bs, num_blocks))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), publish=st.booleans())
    def finish_or_abort(self, i: int, publish: bool) -> None:
        seq = self.live.pop(i % len(self.live))
        self.bm.free(seq.rid, seq.tokens[: seq.computed] if publish else [])
        assert not self.bm.has(seq.rid) and self.bm.table(seq.rid) == []

    @invariant()
    def consistent(self) -> None:
        bm = self.bm
        bm.check_integrity()
        assert bm.num_free + bm.num_cached + bm.num_used == self.num_blocks
        assert bm.num_used == len({b for s in self.live for b in bm.table(s.rid)})
        seen: set[int] = set()
        for seq in self.live:
            table = bm.table(seq.rid)
            for pos in range(seq.computed):  # every computed token's KV is where the table says
                assert self.content[table[pos // self.bs]][pos % self.bs] == seq.tokens[pos]
            for block_id in table:
                assert block_id not in seen or block_id in bm.cache, "private block shared"
            seen.update(table)
        if not self.caching:
            assert bm.num_cached == 0
            assert bm.cache.num_cached == 0


TestBlockManagerModel = BlockManagerModel.TestCase
TestBlockManagerModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)

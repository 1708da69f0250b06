"""BlockManager: the fixed pool of KV blocks, ref-counted and shared through the radix cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from enginecore.free_blocks import FreeBlocks
from enginecore.radix_cache import RadixCache


@dataclass(slots=True)
class _Live:
    """Bookkeeping for one live block table."""

    block_table: list[int]
    num_published: int  # leading blocks that are in the tree and locked by this table
    salt: str = ""  # the prefix tree its blocks are published in (see RadixCache)


# Ownership. Every block id is in exactly one state:
#   free    - in `_free`; its contents mean nothing;
#   private - in exactly one live table and not in the tree (being written, or a partial tail);
#   cached  - in the tree; its ref count is the number of live tables holding it, and at
#             ref 0 it is evictable: still reusable by a prefix match until the pool runs short.
# A table's tree blocks are always its leading `num_published` blocks: the matched prefix,
# then its own full blocks, published in order. Publishing a block whose tokens are already
# cached under another block (two sequences computed the same prefix independently) swaps the
# table entry to the tree's block, which holds the same KV, and frees the duplicate at once.
# Live tables are keyed by their owner's request id (or a scratch key for one-off forwards).
# A fork shares its parent's published blocks (one more reference each) and gets private
# copies of the rest: the runner copies their contents before the next forward.


class BlockManager:
    """The only owner of block ids: allocation, growth, prefix sharing, release and eviction."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool) -> None:
        assert num_blocks > 0
        assert block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.cache = RadixCache(block_size)  # stays empty when prefix_cache is off
        self._free = FreeBlocks(num_blocks)
        self._private: set[int] = set()
        self._live: dict[str, _Live] = {}  # request id -> its table's bookkeeping
        self.copies: list[tuple[int, int]] = []  # partial hits' (source, destination) blocks
        self.evictions_total = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks holding nothing."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks in the prefix tree that no live sequence uses (evictable)."""
        return self.cache.num_evictable

    @property
    def num_used(self) -> int:
        """Blocks in at least one live sequence's table."""
        return len(self._private) + self.cache.num_locked

    @property
    def num_available(self) -> int:
        """Blocks a new allocation could take: free ones plus evictable cached ones."""
        return len(self._free) + self.cache.num_evictable

    @property
    def usage(self) -> float:
        """Fraction of the pool used by live sequences."""
        return self.num_used / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` token slots."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether `num_tokens` slots fit without any prefix hit (a conservative check)."""
        return self.blocks_needed(num_tokens) <= self.num_available

    def has(self, rid: str) -> bool:
        """Whether `rid` holds a live table."""
        return rid in self._live

    def table(self, rid: str) -> list[int]:
        """The block ids of `rid`'s table, in position order; [] if it holds none. Read only."""
        live = self._live.get(rid)
        return [] if live is None else live.block_table

    def allocate(
        self,
        rid: str,
        token_ids: Sequence[int],
        max_new_tokens: int | None = None,
        *,
        salt: str = "",
        match_prefix: bool = True,
    ) -> int | None:
        """Start `rid`'s table: reuse its cached prefix and reserve slots for the next tokens.

        Slots are reserved for the cached prefix plus min(uncached tokens, `max_new_tokens`)
        (all of `token_ids` by default). Returns how many leading tokens were found cached, or
        None, changing nothing, if the pool is short. At least one token is always left
        uncached, so the caller has logits to sample from. The prefix is looked up in `salt`'s
        tree, and not at all unless `match_prefix` (every position is then computed).

        The cached prefix is the longest run of whole cached blocks, then the leading tokens
        of a cached block that continues it on fewer than a block (a partial hit): that block
        is copied into the table's first new block (`take_copies`, for the runner before the
        next forward pass), whose remaining slots the request computes.
        """
        assert rid not in self._live, f"{rid!r} already holds a table"
        limit = max(len(token_ids) - 1, 0) if match_prefix else 0
        match = self.cache.match(token_ids, limit // self.block_size, salt)
        partial = self.cache.match_partial(token_ids, match, limit, salt)
        cached = match.num_tokens + (partial.num_tokens if partial else 0)
        num_new = len(token_ids) - cached
        if max_new_tokens is not None:
            num_new = min(num_new, max_new_tokens)
        need = self.blocks_needed(cached + num_new) - len(match.block_ids)
        self.cache.lock(match.block_ids)  # before taking blocks, so eviction spares them
        new_blocks = self._take(need, match.block_ids[-1] if match.block_ids else None)
        if new_blocks is None:
            self.cache.unlock(match.block_ids)
            return None
        if partial:
            # The partial block's contents are still intact even if the _take above (or a
            # later one this step) evicted it: nothing writes KV before the copies are made.
            self.copies.append((partial.block_id, new_blocks[0]))
        self._live[rid] = _Live(match.block_ids + new_blocks, len(match.block_ids), salt)
        if match_prefix:
            self.prefix_query_tokens += len(token_ids)
            self.prefix_hit_tokens += cached
        return cached

    def fork(self, parent: str, child: str, num_tokens: int) -> list[tuple[int, int]] | None:
        """Start `child`'s table with the KV of `parent`'s first `num_tokens` positions and room
        for one more (the child's next token).

        The parent's published blocks below the block of position `num_tokens` are shared; its
        other blocks up to there become private copies. Returns the (source, destination)
        block ids whose contents the runner must copy before anything else writes the sources,
        or None, changing nothing, if the pool is short.
        """
        assert child not in self._live, f"{child!r} already holds a table"
        live = self._live[parent]
        shared = min(live.num_published, num_tokens // self.block_size)
        sources = live.block_table[shared : self.blocks_needed(num_tokens)]
        assert shared + len(sources) == self.blocks_needed(num_tokens), "parent table too short"
        kept = live.block_table[:shared]
        num_new = self.blocks_needed(num_tokens + 1) - shared
        self.cache.lock(kept)
        new_blocks = self._take(num_new, kept[-1] if kept else None)
        if new_blocks is None:
            self.cache.unlock(kept)
            return None
        self._live[child] = _Live(kept + new_blocks, shared, live.salt)
        return list(zip(sources, new_blocks[: len(sources)], strict=True))

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies partial prefix hits took since the last call:
        to be made before the next forward pass writes any KV."""
        copies, self.copies = self.copies, []
        return copies

    def allocate_scratch(self, key: str, num_tokens: int) -> list[int] | None:
        """A private table under `key` for a one-off forward (embeddings), never published;
        release it with free(key, [])."""
        assert key not in self._live, f"{key!r} already holds a table"
        blocks = self._take(self.blocks_needed(num_tokens), None)
        if blocks is None:
            return None
        self._live[key] = _Live(blocks, 0)
        return blocks

    def append_slots(self, rid: str, num_tokens: int) -> bool:
        """Grow `rid`'s table to hold `num_tokens` slots; False, changing nothing, if short."""
        block_table = self._live[rid].block_table
        need = self.blocks_needed(num_tokens) - len(block_table)
        new_blocks = self._take(need, block_table[-1] if block_table else None)
        if new_blocks is None:
            return False
        block_table.extend(new_blocks)
        return True

    def cache_full_blocks(self, rid: str, token_ids: Sequence[int]) -> None:
        """Publish the full blocks of `token_ids` so later requests can share them.

        `token_ids` must be `rid`'s tokens whose KV is written and final (the computed prefix,
        never a freshly sampled token or an unverified draft). May swap entries of its table
        for identical cached blocks (see Ownership above).
        """
        live = self._live[rid]
        if not self.prefix_cache:
            return
        block_table = live.block_table
        num_full = min(len(token_ids) // self.block_size, len(block_table))
        if num_full <= live.num_published:
            return
        start = live.num_published
        tree_ids = self.cache.insert(
            token_ids[: num_full * self.block_size], block_table[:num_full], live.salt
        )
        assert tree_ids[:start] == block_table[:start], "published prefix changed"
        for i in range(start, num_full):
            self._private.remove(block_table[i])
            if tree_ids[i] != block_table[i]:
                self._free.put(block_table[i])  # duplicate of a cached block
                block_table[i] = tree_ids[i]
        self.cache.lock(tree_ids[start:num_full])
        live.num_published = num_full

    def free(self, rid: str, token_ids: Sequence[int]) -> None:
        """Release the table of a finished, aborted or preempted sequence (nothing if it holds
        none). Its full computed blocks are published first (see `cache_full_blocks` for what
        `token_ids` must be), so they stay cached; the rest go back to free.
        """
        if rid not in self._live:
            return  # never allocated, or freed already
        self.cache_full_blocks(rid, token_ids)
        live = self._live.pop(rid)
        block_table = live.block_table
        self.cache.unlock(block_table[: live.num_published])
        for block_id in block_table[live.num_published :]:
            self._private.remove(block_id)
            self._free.put(block_id)

    def _take(self, num_blocks: int, after: int | None) -> list[int] | None:
        """Take blocks for private use, evicting LRU cached blocks if free ones run out; where
        it can, they continue from block `after` (see FreeBlocks)."""
        if num_blocks <= 0:
            return []
        if num_blocks > self.num_available:
            return None
        shortage = num_blocks - len(self._free)
        if shortage > 0:
            evicted = self.cache.evict(shortage)
            assert len(evicted) == shortage
            self.evictions_total += shortage
            self._free.extend(evicted)
        taken = self._free.take(num_blocks, after)
        self._private.update(taken)
        return taken

    def check_integrity(self) -> None:
        """Assert every block is in exactly one state and ref counts match the live tables."""
        self.cache.check_integrity()
        free = set(self._free)
        cached = {b for b in range(self.num_blocks) if b in self.cache}
        assert len(free) == len(self._free), "block freed twice"
        assert not free & self._private, "free block in a table"
        assert not free & cached, "free block in the tree"
        assert not self._private & cached, "private block in the tree"
        assert free | self._private | cached == set(range(self.num_blocks)), "block leaked"
        assert self.num_free + self.num_cached + self.num_used == self.num_blocks
        refs: Counter[int] = Counter()
        private_uses: Counter[int] = Counter()
        for live in self._live.values():
            table = live.block_table
            assert all(b in self.cache for b in table[: live.num_published])
            assert all(b in self._private for b in table[live.num_published :])
            refs.update(table[: live.num_published])
            private_uses.update(table[live.num_published :])
        assert set(private_uses) == self._private, "private block outside any live table"
        assert all(n == 1 for n in private_uses.values()), "private block in two tables"
        for block_id in cached:
            assert self.cache.ref_count(block_id) == refs[block_id], f"block {block_id} ref"
        assert self.prefix_cache or self.cache.num_cached == 0

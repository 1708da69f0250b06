"""RadixCache: a prefix tree of KV blocks whose edges are whole blocks of token ids."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

BlockKey = tuple[int, ...]


class MatchResult(NamedTuple):
    """Longest cached prefix: its blocks, root first, and the tokens they hold."""

    block_ids: list[int]
    num_tokens: int


class PartialHit(NamedTuple):
    """A cached block, child of a match's last block, whose leading `num_tokens` token ids are
    the next ones of the query (fewer than a block): its KV for them can be copied, not
    computed."""

    block_id: int
    num_tokens: int


@dataclass(slots=True, eq=False)
class _Node:
    """One cached block: the edge from its parent is `key` (block_size token ids)."""

    key: BlockKey
    block_id: int
    parent: _Node | None
    children: dict[BlockKey, _Node] = field(default_factory=dict)
    sorted_keys: list[BlockKey] = field(default_factory=list)  # of `children`, for partial hits
    ref: int = 0  # number of live block tables holding this block
    last_access: int = 0  # logical clock of the last insert/lock/unlock
    salt: str = ""  # roots only: the cache salt whose tree this is


class RadixCache:
    """Block-aligned prefix tree with ref counts and LRU eviction of unreferenced leaves.

    Keys are block-aligned, so nodes never split. A node with ref 0 is evictable: since a
    table holding a block also holds every ancestor, the descendants of a ref-0 node are
    ref 0 too, and evicting leaves repeatedly can free all of them.

    Each cache salt has its own tree (the unsalted one always exists; a salted one lives
    while it holds blocks): a prefix is shared only between requests of the same salt.
    """

    def __init__(self, block_size: int) -> None:
        assert block_size > 0
        self.block_size = block_size
        self._roots = {"": _Node(key=(), block_id=-1, parent=None)}  # cache salt -> its tree
        self._nodes: dict[int, _Node] = {}  # block_id -> node
        self._num_evictable = 0  # nodes with ref == 0
        self._clock = 0
        # Lazy min-heap of (last_access, block_id) for ref-0 leaves; an entry is stale
        # when the node is gone, locked, has children or was touched since the push.
        self._heap: list[tuple[int, int]] = []

    @property
    def num_cached(self) -> int:
        """Blocks held by the tree, referenced or not."""
        return len(self._nodes)

    @property
    def num_evictable(self) -> int:
        """Blocks in the tree that no live table references."""
        return self._num_evictable

    @property
    def num_locked(self) -> int:
        """Blocks in the tree that at least one live table references."""
        return len(self._nodes) - self._num_evictable

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._nodes

    def ref_count(self, block_id: int) -> int:
        """Ref count of a cached block."""
        return self._nodes[block_id].ref

    def match(
        self, token_ids: Sequence[int], max_blocks: int | None = None, salt: str = ""
    ) -> MatchResult:
        """Longest cached prefix of whole blocks (at most `max_blocks`); changes nothing."""
        bs = self.block_size
        limit = len(token_ids) // bs
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        node = self._roots.get(salt)
        block_ids: list[int] = []
        if node is None:
            return MatchResult(block_ids, 0)
        for i in range(limit):
            child = node.children.get(tuple(token_ids[i * bs : (i + 1) * bs]))
            if child is None:
                break
            block_ids.append(child.block_id)
            node = child
        return MatchResult(block_ids, len(block_ids) * bs)

    def match_partial(
        self, token_ids: Sequence[int], match: MatchResult, max_tokens: int, salt: str = ""
    ) -> PartialHit | None:
        """The cached block continuing `match` (this salt's `match(token_ids)`, maybe cut
        short) on the most of the query's next tokens, at most up to position `max_tokens`
        and fewer than a block; None if no child of the match's last block starts with the
        next token. Changes nothing.

        In lexicographic order the key sharing the longest prefix with a query is next to the
        query's insertion point, so two comparisons find it among any number of children.
        """
        start = match.num_tokens
        query = tuple(token_ids[start : min(start + self.block_size, max_tokens)])
        if not query:
            return None
        if match.block_ids:
            node = self._nodes[match.block_ids[-1]]
        else:
            root = self._roots.get(salt)
            if root is None:
                return None
            node = root
        keys = node.sorted_keys
        at = bisect.bisect_left(keys, query)
        best: PartialHit | None = None
        for key in keys[max(at - 1, 0) : at + 1]:
            n = _common_prefix(key, query)
            if n and (best is None or n > best.num_tokens):
                best = PartialHit(node.children[key].block_id, min(n, self.block_size - 1))
        return best

    def insert(
        self, token_ids: Sequence[int], block_ids: Sequence[int], salt: str = ""
    ) -> list[int]:
        """Publish `block_ids` as the blocks of `token_ids`; return the tree's block per position.

        Where a key is already cached the tree keeps its own block, so the returned id
        differs from the given one: that given block is a duplicate the caller still owns.
        New nodes start unreferenced; the caller locks the ones it keeps using.
        """
        bs = self.block_size
        assert len(token_ids) >= len(block_ids) * bs
        self._clock += 1
        node = self._roots.get(salt)
        if node is None:
            node = self._roots[salt] = _Node(key=(), block_id=-1, parent=None, salt=salt)
        tree_ids: list[int] = []
        created = False
        for i, block_id in enumerate(block_ids):
            key = tuple(token_ids[i * bs : (i + 1) * bs])
            child = node.children.get(key)
            if child is None:
                assert block_id not in self._nodes, f"block {block_id} cached under another key"
                child = _Node(key=key, block_id=block_id, parent=node, last_access=self._clock)
                node.children[key] = child
                bisect.insort(node.sorted_keys, key)
                self._nodes[block_id] = child
                self._num_evictable += 1
                created = True
            tree_ids.append(child.block_id)
            node = child
        if created:  # the last node is a new, unreferenced leaf
            heapq.heappush(self._heap, (node.last_access, node.block_id))
        return tree_ids

    def lock(self, block_ids: Sequence[int]) -> None:
        """Add one reference to each block (a live table now holds them)."""
        self._clock += 1
        for block_id in block_ids:
            node = self._nodes[block_id]
            if node.ref == 0:
                self._num_evictable -= 1
            node.ref += 1
            node.last_access = self._clock

    def unlock(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; unreferenced blocks stay cached (evictable)."""
        self._clock += 1
        for block_id in block_ids:
            node = self._nodes[block_id]
            assert node.ref > 0, f"unlock of unreferenced block {block_id}"
            node.ref -= 1
            node.last_access = self._clock
            if node.ref == 0:
                self._num_evictable += 1
                if not node.children:
                    heapq.heappush(self._heap, (node.last_access, block_id))

    def evict(self, num_blocks: int) -> list[int]:
        """Remove up to `num_blocks` unreferenced blocks, least recently used leaf first."""
        evicted: list[int] = []
        while len(evicted) < num_blocks and self._heap:
            last_access, block_id = heapq.heappop(self._heap)
            node = self._nodes.get(block_id)
            if node is None or not self._is_evictable_leaf(node, last_access):
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            del parent.sorted_keys[bisect.bisect_left(parent.sorted_keys, node.key)]
            del self._nodes[block_id]
            self._num_evictable -= 1
            evicted.append(block_id)
            if parent.parent is None:  # a root: a salted tree goes when it holds nothing
                if parent.salt and not parent.children:
                    del self._roots[parent.salt]
            elif parent.ref == 0 and not parent.children:
                heapq.heappush(self._heap, (parent.last_access, parent.block_id))
        if len(self._heap) > 4 * len(self._nodes) + 64:
            self._compact_heap()
        return evicted

    def _is_evictable_leaf(self, node: _Node, last_access: int) -> bool:
        return node.ref == 0 and not node.children and node.last_access == last_access

    def _compact_heap(self) -> None:
        self._heap = [
            (t, b)
            for t, b in self._heap
            if b in self._nodes and self._is_evictable_leaf(self._nodes[b], t)
        ]
        heapq.heapify(self._heap)

    def check_integrity(self) -> None:
        """Assert the tree's structure, ref counts, counters and eviction heap agree."""
        seen = 0
        num_unreferenced = 0
        assert "" in self._roots
        assert all(r.salt == s and r.parent is None for s, r in self._roots.items())
        assert all(r.children for s, r in self._roots.items() if s), "an empty salted tree"
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            child_refs = 0
            assert node.sorted_keys == sorted(node.children), "sorted_keys out of step"
            for key, child in node.children.items():
                assert child.key == key
                assert len(key) == self.block_size
                assert child.parent is node
                assert self._nodes.get(child.block_id) is child
                assert child.ref >= 0
                child_refs += child.ref
                stack.append(child)
            if node.parent is not None:
                seen += 1
                num_unreferenced += node.ref == 0
                # every table holding a child holds its parent, so refs shrink going down
                assert node.ref >= child_refs, f"block {node.block_id} ref < children's refs"
        assert seen == len(self._nodes), "nodes unreachable from the root"
        assert num_unreferenced == self._num_evictable
        entries = set(self._heap)
        for node in self._nodes.values():
            if node.ref == 0 and not node.children:
                entry = (node.last_access, node.block_id)
                assert entry in entries, f"evictable leaf {node.block_id} missing from the heap"


def _common_prefix(a: BlockKey, b: BlockKey) -> int:
    """Length of the longest common prefix of two token-id tuples."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

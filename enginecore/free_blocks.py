"""FreeBlocks: the pool's free block ids, handed out so that a table's blocks tend to be adjacent.

A decode's attention streams every block of its sequence; adjacent blocks stream as one run,
while each jump to a scattered block restarts the hardware prefetcher (30 layers of attention
for 64 decodes, 32-token blocks: 18 ms contiguous, 30 ms scattered; bench/README.md). So a
table grows into the block right after its last one when that is free, and a block with no
such neighbour comes from the middle of the largest free run: the table before the run and
the new one both keep room to grow.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


class FreeBlocks:
    def __init__(self, num_blocks: int) -> None:
        self._ids = list(range(num_blocks))  # sorted

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def put(self, block_id: int) -> None:
        bisect.insort(self._ids, block_id)

    def extend(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            self.put(block_id)

    def take(self, num_blocks: int, after: int | None) -> list[int]:
        """`num_blocks` ids (at most len(self)), continuing from block `after` where it can."""
        taken: list[int] = []
        nxt = -1 if after is None else after + 1
        while len(taken) < num_blocks:
            i = bisect.bisect_left(self._ids, nxt)
            if i == len(self._ids) or self._ids[i] != nxt:
                i = self._middle_of_largest_run()
            nxt = self._ids.pop(i)
            taken.append(nxt)
            nxt += 1
        return taken

    def _middle_of_largest_run(self) -> int:
        """Index in `_ids` of the middle of the longest run of consecutive free ids."""
        ids = self._ids
        best_start, best_len, start = 0, 0, 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[i - 1] + 1:
                if i - start > best_len:
                    best_start, best_len = start, i - start
                start = i
        return best_start + best_len // 2

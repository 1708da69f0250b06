"""Batch: the scheduler -> runner contract, flat int32 arrays of one varlen forward call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from enginecore.weights import I32


class SeqChunk(NamedTuple):
    """The tokens one sequence feeds to this step."""

    token_ids: list[int]  # new tokens: a prefill chunk, one decode token, or token + drafts
    start_pos: int  # position of token_ids[0]; everything before it is in the cache
    block_table: list[int]  # covers start_pos + len(token_ids) positions
    num_sample: int  # logits wanted for the last num_sample tokens (0 mid-prompt)


@dataclass(slots=True)
class Batch:
    token_ids: I32  # (n,)
    positions: I32  # (n,)
    seq_of_token: I32  # (n,) row of block_tables
    block_tables: I32  # (n_seqs, max_blocks)
    slot_mapping: I32  # (n,) block_id * block_size + offset
    sample_rows: I32  # (r,) rows whose logits are computed, in sequence order
    num_seqs: int

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @staticmethod
    def build(chunks: list[SeqChunk], block_size: int, repeat_last: Sequence[int] = ()) -> Batch:
        """`repeat_last`: chunks whose last row's logits are returned once more, after every
        chunk's rows and in this order (other choices of a request sample from them)."""
        n = sum(len(c.token_ids) for c in chunks)
        max_blocks = max((len(c.block_table) for c in chunks), default=1)
        token_ids = np.empty(n, np.int32)
        positions = np.empty(n, np.int32)
        seq_of_token = np.empty(n, np.int32)
        block_tables = np.zeros((len(chunks), max_blocks), np.int32)
        sample_rows: list[int] = []
        last_rows: list[int] = []
        row = 0
        for s, c in enumerate(chunks):
            k = len(c.token_ids)
            assert c.start_pos + k <= len(c.block_table) * block_size, "block table too short"
            assert 0 <= c.num_sample <= k
            token_ids[row : row + k] = c.token_ids
            positions[row : row + k] = np.arange(c.start_pos, c.start_pos + k)
            seq_of_token[row : row + k] = s
            block_tables[s, : len(c.block_table)] = c.block_table
            sample_rows.extend(range(row + k - c.num_sample, row + k))
            row += k
            last_rows.append(row - 1)
        sample_rows += [last_rows[s] for s in repeat_last]
        tables_of_token = block_tables[seq_of_token, positions // block_size]
        slot_mapping = (tables_of_token * block_size + positions % block_size).astype(np.int32)
        return Batch(
            token_ids, positions, seq_of_token, block_tables, slot_mapping,
            np.asarray(sample_rows, np.int32), len(chunks),
        )  # fmt: skip

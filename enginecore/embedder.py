"""Embedder: mean-pooled, L2-normalized final hidden states, computed between engine steps."""

from __future__ import annotations

import numpy as np

from enginecore.block_manager import BlockManager
from enginecore.model_runner import ModelRunner
from shared.protocol import RejectReason


class Embedder:
    def __init__(self, runner: ModelRunner, blocks: BlockManager, max_model_len: int) -> None:
        self.runner = runner
        self.blocks = blocks
        self.max_model_len = max_model_len

    def embed(
        self, rid: str, inputs: list[list[int]]
    ) -> list[list[float]] | tuple[RejectReason, str]:
        """One unit vector per input, in input order; or why the inputs cannot be embedded."""
        vocab = self.runner.cfg.vocab_size
        for ids in inputs:
            if not ids or len(ids) > self.max_model_len or min(ids) < 0 or max(ids) >= vocab:
                return (
                    RejectReason.INVALID,
                    f"each input needs 1..{self.max_model_len} token ids in [0, {vocab})",
                )
        # scratch blocks under a key no generation request holds, never published to the
        # prefix cache: every position's hidden state is needed, so nothing may be skipped
        key = f"embed:{rid}"
        if self.blocks.has(key):
            return RejectReason.INVALID, f"request id {rid!r} is already in use"
        vectors = []
        for ids in inputs:
            table = self.blocks.allocate_scratch(key, len(ids))
            if table is None:
                return RejectReason.NO_CAPACITY, "no KV blocks free for embeddings"
            try:
                hidden = self.runner.hidden_states(ids, table)  # (n, d)
            finally:
                self.blocks.free(key, [])
            mean = hidden.astype(np.float64).mean(axis=0)
            vectors.append((mean / max(float(np.linalg.norm(mean)), 1e-12)).tolist())
        return vectors

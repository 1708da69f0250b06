"""ModelRunner: owns the weights, the paged KV cache and the RoPE tables; runs one Batch."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from enginecore import loader
from enginecore.batch import Batch, SeqChunk
from enginecore.model import BLAS_ATTENTION_MIN_ROWS, KVCache, ModelConfig, forward, rope_tables
from enginecore.weights import F32, QUANT_KERNEL_MAX_ROWS, Weights

log = logging.getLogger(__name__)


def kv_block_bytes(cfg: ModelConfig, block_size: int) -> int:
    return 2 * cfg.num_layers * block_size * cfg.kv_dim * 4


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: Weights,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
    ) -> None:
        self.cfg = cfg
        self.weights = weights
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.cache = KVCache.allocate(cfg, num_blocks, block_size)
        self.rope = rope_tables(cfg, max_model_len)

    @staticmethod
    def from_path(
        path: Path, block_size: int, num_blocks: int, kv_cache_bytes: int, max_model_len: int
    ) -> ModelRunner:
        cfg, weights = loader.load(path)
        max_len = min(max_model_len or cfg.max_position, cfg.max_position)
        if num_blocks == 0:
            num_blocks = max(kv_cache_bytes // kv_block_bytes(cfg, block_size), 1)
        return ModelRunner(cfg, weights, num_blocks, block_size, max_len)

    def run(self, batch: Batch, return_hidden: bool = False) -> F32:
        """Logits (r, vocab) of batch.sample_rows, or final-normed hidden states (r, d)."""
        return forward(
            self.cfg, self.weights, self.cache, self.rope,
            batch.token_ids, batch.positions, batch.seq_of_token,
            batch.block_tables, batch.slot_mapping, batch.sample_rows, return_hidden,
        )  # fmt: skip

    def hidden_states(self, chunks: list[SeqChunk]) -> F32:
        """Final-normed hidden states (rows, d) of every token the chunks feed, chunk by chunk
        (each chunk's num_sample is its length)."""
        return self.run(Batch.build(chunks, self.block_size), return_hidden=True)

    def warmup(self) -> None:
        """Compile (or load from the numba cache) every kernel signature before serving."""
        t0 = time.monotonic()
        need = -(-BLAS_ATTENTION_MIN_ROWS // self.block_size)
        table = list(range(min(need, self.num_blocks)))
        # the quantized-kernel path, the BLAS path, and BLAS attention over a long chunk
        for n in (1, QUANT_KERNEL_MAX_ROWS + 1, BLAS_ATTENTION_MIN_ROWS):
            n = min(n, len(table) * self.block_size)
            chunk = SeqChunk(list(range(n)), 0, table, 1)
            self.run(Batch.build([chunk], self.block_size))
            self.run(Batch.build([chunk], self.block_size), return_hidden=True)
        self.cache.k[:, table] = 0
        self.cache.v[:, table] = 0
        log.info("warmup done in %.1f s", time.monotonic() - t0)

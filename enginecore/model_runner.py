"""ModelRunner: owns the weights, the paged KV cache and the RoPE tables; runs one Batch."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from enginecore import loader
from enginecore.batch import Batch, SeqChunk
from enginecore.kernels import dot
from enginecore.model import (
    BLAS_ATTENTION_MIN_ROWS,
    KV_DTYPES,
    KVCache,
    ModelConfig,
    forward,
    rope_tables,
    stack_layers,
)  # fmt: skip
from enginecore.weights import EXACT_STREAM_MAX_ROWS, F32, Numerics, Weights

log = logging.getLogger(__name__)


def kv_block_bytes(cfg: ModelConfig, block_size: int, kv_cache_dtype: str = "f32") -> int:
    itemsize = np.dtype(KV_DTYPES[kv_cache_dtype]).itemsize
    return 2 * cfg.num_layers * block_size * cfg.kv_dim * itemsize


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: Weights,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        kv_cache_dtype: str = "f32",
    ) -> None:
        self.cfg = cfg
        self.weights = weights
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.cache = KVCache.allocate(cfg, num_blocks, block_size, kv_cache_dtype)
        self.rope = rope_tables(cfg, max_model_len)
        self.stacked = stack_layers(cfg, weights, self.rope)

    @staticmethod
    def from_path(
        path: Path,
        block_size: int,
        num_blocks: int,
        kv_cache_bytes: int,
        max_model_len: int,
        numerics: str = "exact",
        kv_cache_dtype: str = "f32",
    ) -> ModelRunner:
        t0 = time.monotonic()
        cfg, weights = loader.load(path, Numerics(numerics))
        log.info(
            "loaded %s in %.1f s: %.1f MB of weights, numerics %s, integer dot products by %s "
            "(this host: %s)", path.name, time.monotonic() - t0, weights.nbytes / 1e6, numerics,
            dot.SELECTED.name, ", ".join(i.name for i in dot.supported()),
        )  # fmt: skip
        max_len = min(max_model_len or cfg.max_position, cfg.max_position)
        if num_blocks == 0:
            num_blocks = max(kv_cache_bytes // kv_block_bytes(cfg, block_size, kv_cache_dtype), 1)
        return ModelRunner(cfg, weights, num_blocks, block_size, max_len, kv_cache_dtype)

    def run(self, batch: Batch, return_hidden: bool = False) -> F32:
        """Logits (r, vocab) of batch.sample_rows, or final-normed hidden states (r, d)."""
        return forward(
            self.cfg, self.weights, self.cache, self.rope,
            batch.token_ids, batch.positions, batch.seq_of_token,
            batch.block_tables, batch.slot_mapping, batch.sample_rows, return_hidden, self.stacked,
        )  # fmt: skip

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks, every layer: (source, destination) block ids."""
        src, dst = (np.asarray(ids, np.intp) for ids in zip(*pairs, strict=True))
        self.cache.k[:, dst] = self.cache.k[:, src]
        self.cache.v[:, dst] = self.cache.v[:, src]

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
        for n in (1, EXACT_STREAM_MAX_ROWS + 1, BLAS_ATTENTION_MIN_ROWS):
            n = min(n, len(table) * self.block_size)
            chunk = SeqChunk(list(range(n)), 0, table, 1)
            self.run(Batch.build([chunk], self.block_size))
            self.run(Batch.build([chunk], self.block_size), return_hidden=True)
        self.cache.k[:, table] = 0
        self.cache.v[:, table] = 0
        log.info("warmup done in %.1f s", time.monotonic() - t0)

"""Embedder: mean-pooled, L2-normalized final hidden states, computed chunk by chunk.

An embedding request waits here until the engine gives it the step budget left over by
generation: each step runs at most that many of its tokens, as one forward call of its own
(several inputs batched as sequences), so a long input stalls decodes no longer than a
prefill chunk would. An input's positions are fed in order; each chunk attends to the KV its
earlier chunks wrote into the input's scratch table, and adds its rows to a running sum.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from enginecore.batch import SeqChunk
from enginecore.block_manager import BlockManager
from enginecore.model_runner import ModelRunner
from shared.protocol import Embedded, Rejected, RejectReason

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class _Input:
    key: str  # its scratch table in the block manager: no generation request holds this key
    token_ids: list[int]
    num_computed: int = 0
    total: F64 | None = None  # (d,) float64 sum of the hidden states so far

    @property
    def num_left(self) -> int:
        return len(self.token_ids) - self.num_computed


@dataclass(slots=True)
class EmbedJob:
    """One Embed message: its inputs in order, the vectors of those done."""

    rid: str
    client: bytes
    inputs: list[_Input]
    vectors: list[list[float]] = field(default_factory=list)
    num_tokens: int = 0

    @property
    def num_left(self) -> int:
        return sum(i.num_left for i in self.inputs[len(self.vectors) :])


Reply = tuple[bytes, Embedded | Rejected]  # a job's answer, for the frontend that asked


class Embedder:
    def __init__(self, runner: ModelRunner, blocks: BlockManager, max_model_len: int) -> None:
        self.runner = runner
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.jobs: dict[str, EmbedJob] = {}  # first come, first served

    def has_work(self) -> bool:
        return bool(self.jobs)

    def waiting_tokens(self, cap: int) -> int:
        """Tokens still to embed, counted up to `cap`."""
        total = 0
        for job in self.jobs.values():
            total += job.num_left
            if total >= cap:
                return cap
        return total

    def refusal(self, rid: str, inputs: list[list[int]]) -> tuple[RejectReason, str] | None:
        """Why these inputs cannot be embedded, or None."""
        vocab = self.runner.cfg.vocab_size
        for ids in inputs:
            if not ids or len(ids) > self.max_model_len or min(ids) < 0 or max(ids) >= vocab:
                return (
                    RejectReason.INVALID,
                    f"each input needs 1..{self.max_model_len} token ids in [0, {vocab})",
                )
        if not inputs:
            return RejectReason.INVALID, "no inputs"
        if rid in self.jobs:
            return RejectReason.INVALID, f"request id {rid!r} is already in use"
        return None

    def add(self, rid: str, client: bytes, inputs: list[list[int]]) -> None:
        assert self.refusal(rid, inputs) is None
        items = [_Input(f"embed:{rid}:{i}", list(ids)) for i, ids in enumerate(inputs)]
        self.jobs[rid] = EmbedJob(rid, client, items, num_tokens=sum(map(len, inputs)))

    def drop(self, rid: str, client: bytes | None = None) -> EmbedJob | None:
        """Remove `rid` (only if `client` owns it, when given) and free its scratch tables."""
        job = self.jobs.get(rid)
        if job is None or (client is not None and job.client != client):
            return None
        del self.jobs[rid]
        for item in job.inputs:
            if self.blocks.has(item.key):
                self.blocks.free(item.key, [])
        return job

    def forget(self, client: bytes) -> None:
        for rid in [rid for rid, job in self.jobs.items() if job.client == client]:
            self.drop(rid)

    # ---- one chunk per step ----------------------------------------------------------------

    def step(self, budget: int) -> tuple[list[Reply], int]:
        """Run up to `budget` tokens of the waiting inputs in one forward call: the answers of
        the jobs that ended (done, or refused), and how many tokens ran."""
        replies: list[Reply] = []
        chunks: list[tuple[EmbedJob, _Input, SeqChunk]] = []
        for job, item in self._next_inputs():
            if budget <= 0:
                break
            if not self.blocks.has(item.key):
                table = self.blocks.allocate_scratch(item.key, len(item.token_ids))
                if table is None:
                    if chunks:
                        break  # the blocks of this step's chunks come back soon: wait for them
                    self.drop(job.rid)
                    why = "no KV blocks free for embeddings"
                    replies.append((job.client, Rejected(job.rid, RejectReason.NO_CAPACITY, why)))
                    continue
            n = min(item.num_left, budget)
            start = item.num_computed
            tokens = item.token_ids[start : start + n]
            chunks.append((job, item, SeqChunk(tokens, start, self.blocks.table(item.key), n)))
            budget -= n
        if not chunks:
            return replies, 0
        try:
            hidden = self.runner.hidden_states([c for _, _, c in chunks])  # (rows, d)
        except Exception:
            # the jobs of this call fail; generation and the other jobs go on
            failed = {job.rid: job for job, _, _ in chunks}
            log.exception("the embedding forward failed: failing %d requests", len(failed))
            for rid, job in failed.items():
                self.drop(rid)
                why = "the engine core failed on this request"
                replies.append((job.client, Rejected(rid, RejectReason.INTERNAL, why)))
            return replies, 0
        row = 0  # the rows of hidden are the chunks' tokens, in order
        for job, item, chunk in chunks:
            n = len(chunk.token_ids)
            part = hidden[row : row + n].astype(np.float64).sum(axis=0)
            item.total = part if item.total is None else item.total + part
            item.num_computed += n
            row += n
            if item.num_left == 0:
                self.blocks.free(item.key, [])
                mean = item.total / len(item.token_ids)
                job.vectors.append((mean / max(float(np.linalg.norm(mean)), 1e-12)).tolist())
                if len(job.vectors) == len(job.inputs):
                    del self.jobs[job.rid]
                    replies.append((job.client, Embedded(job.rid, job.vectors, job.num_tokens)))
        return replies, row

    def _next_inputs(self) -> Iterator[tuple[EmbedJob, _Input]]:
        """The unfinished inputs of every job, in order (a job's inputs one after another)."""
        for job in list(self.jobs.values()):
            for item in job.inputs[len(job.vectors) :]:
                if self.jobs.get(job.rid) is not job:
                    break  # refused meanwhile
                yield job, item

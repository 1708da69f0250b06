"""Scheduler: continuous batching under a sequence cap and a per-step token budget.

Each step: running decodes first (one token each), then prefill chunks of running requests,
then new requests by priority, then speculative drafts for the decodes from whatever budget
and free slots are left (so drafting never delays anyone). When blocks run out a decode
preempts the lowest-priority, newest running request (recompute: its blocks are freed,
their full blocks stay in the prefix cache, and it waits at the head of its priority).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from enginecore.batch import Batch, SeqChunk
from enginecore.block_manager import BlockManager
from enginecore.request import Request, RequestStatus
from enginecore.spec import NgramProposer, drafts_allowed, record_verification


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_chunk: int  # 0 = whole prompts (still within the token budget)
    max_model_len: int
    queue_capacity: int


class Scheduled(NamedTuple):
    batch: Batch
    requests: list[Request]  # in the order of the batch's sequences
    chunks: list[SeqChunk]


class Scheduler:
    def __init__(
        self, cfg: SchedulerConfig, blocks: BlockManager, proposer: NgramProposer | None
    ) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.proposer = proposer
        self.waiting: list[Request] = []  # admitted, not running (new or preempted)
        self.running: list[Request] = []
        self.preemptions_total = 0

    # ---- admission -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queue_full(self) -> bool:
        return sum(1 for r in self.waiting if not r.started) >= self.cfg.queue_capacity

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def expire(self, now: float) -> list[Request]:
        """Remove and return requests that waited past their deadline without ever starting."""
        late = [
            r for r in self.waiting if not r.started and r.deadline is not None and now > r.deadline
        ]
        for r in late:
            self.waiting.remove(r)
        return late

    def abort(self, rid: str) -> Request | None:
        for queue in (self.waiting, self.running):
            for r in queue:
                if r.rid == rid:
                    queue.remove(r)
                    self._release(r, RequestStatus.FINISHED_ABORTED)
                    return r
        return None

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> Scheduled | None:
        budget = self.cfg.max_num_batched_tokens
        chosen: list[tuple[Request, SeqChunk]] = []
        # 1. decodes of running requests (their prompts are done), highest priority, oldest first
        for req in sorted(self.running, key=lambda r: (-r.priority, r.arrival)):
            if req.is_prefilling or req.status != RequestStatus.RUNNING or budget < 1:
                continue
            if not self._reserve(req, req.num_tokens, chosen):
                continue
            req.drafts = []
            chosen.append((req, SeqChunk([req.last_token], req.num_computed, req.block_table, 1)))
            budget -= 1
        num_decodes = len(chosen)
        # 2. prefill chunks of running requests, then 3. waiting requests by priority
        for req in sorted(self.running, key=lambda r: (-r.priority, r.arrival)):
            if req.is_prefilling and req.status == RequestStatus.RUNNING:
                budget = self._schedule_prefill(req, budget, chosen)
        self.waiting.sort(key=lambda r: (-r.priority, r.arrival))
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            req = self.waiting[0]
            alloc = self.blocks.allocate(req.all_ids, self._chunk_len(budget))
            if alloc is None:
                break
            self.waiting.pop(0)
            req.block_table = alloc.block_table
            req.num_computed = alloc.num_cached_tokens
            if req.num_preemptions == 0:
                req.num_cached_tokens = alloc.num_cached_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            budget = self._schedule_prefill(req, budget, chosen)
        # 4. speculative drafts for the decodes, from the budget left: never at the expense of a
        # decode or a prompt, and never by preemption (drafts that do not fit are dropped)
        for i in range(num_decodes):
            req, chunk = chosen[i]
            drafts = self._drafts(req, budget)
            if drafts and self.blocks.append_slots(req.block_table, req.num_tokens + len(drafts)):
                req.drafts = drafts
                tokens = [req.last_token, *drafts]
                chosen[i] = (req, SeqChunk(tokens, chunk.start_pos, chunk.block_table, len(tokens)))
                budget -= len(drafts)
        if not chosen:
            return None
        chunks = [c for _, c in chosen]
        return Scheduled(
            Batch.build(chunks, self.blocks.block_size), [r for r, _ in chosen], chunks
        )

    def _chunk_len(self, budget: int) -> int:
        return min(budget, self.cfg.prefill_chunk) if self.cfg.prefill_chunk else budget

    def _schedule_prefill(
        self, req: Request, budget: int, chosen: list[tuple[Request, SeqChunk]]
    ) -> int:
        remaining = req.num_tokens - req.num_computed
        n = min(remaining, self._chunk_len(budget))
        if n <= 0 or not self._reserve(req, req.num_computed + n, chosen):
            return budget
        tokens = req.all_ids[req.num_computed : req.num_computed + n]
        req.drafts = []
        chosen.append(
            (req, SeqChunk(tokens, req.num_computed, req.block_table, 1 if n == remaining else 0))
        )
        return budget - n

    def _drafts(self, req: Request, budget: int) -> list[int]:
        if self.proposer is None or budget < 1:
            return []
        room = min(
            req.params.max_tokens - len(req.output_ids) - 1,  # the bonus token also counts
            self.cfg.max_model_len - req.num_tokens - 1,
            budget,
        )
        if room < 1:
            return []
        return self.proposer.propose(req.all_ids)[: min(room, drafts_allowed(req))]

    def _reserve(
        self, req: Request, num_tokens: int, chosen: list[tuple[Request, SeqChunk]]
    ) -> bool:
        """Grow req's table to num_tokens slots, preempting others not yet in this step's batch.

        The victim is the lowest-priority, newest such request, possibly req itself (False).
        """
        while not self.blocks.append_slots(req.block_table, num_tokens):
            taken = {id(r) for r, _ in chosen}
            victim = min(
                (r for r in self.running if id(r) not in taken),
                key=lambda r: (r.priority, -r.arrival),
            )
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.blocks.free(req.all_ids[: req.num_computed], req.block_table)
        req.num_computed = 0
        req.drafts = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.append(req)

    # ---- after the forward pass ----------------------------------------------------------

    def update(self, scheduled: Scheduled, sampled: list[list[int]]) -> list[Request]:
        """Record each sequence's computed chunk and new tokens; return the finished requests.

        sampled[i] is what sequence i emits this step: [] mid-prompt, one token, or the
        accepted drafts plus a correction/bonus token.
        """
        finished = []
        for req, chunk, new in zip(scheduled.requests, scheduled.chunks, sampled, strict=True):
            if req.status != RequestStatus.RUNNING:
                continue
            # fed tokens are computed, except drafts beyond the accepted ones
            full_before = req.num_computed // self.blocks.block_size
            req.num_computed += len(chunk.token_ids) - len(req.drafts) + max(len(new) - 1, 0)
            if req.drafts and self.proposer is not None:
                record_verification(req, len(req.drafts), len(new) - 1, self.proposer.num_tokens)
            req.drafts = []
            req.new_ids = []
            for token in new:
                req.output_ids.append(token)
                req.new_ids.append(token)
                status = self._finish_status(req, token)
                if status is not None:
                    self.running.remove(req)
                    self._release(req, status)
                    finished.append(req)
                    break
            else:  # publish blocks this step filled (no O(context) copy on the other steps)
                if req.num_computed // self.blocks.block_size > full_before:
                    self.blocks.cache_full_blocks(req.all_ids[: req.num_computed], req.block_table)
        return finished

    def _finish_status(self, req: Request, token: int) -> RequestStatus | None:
        if token in req.stop_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.cfg.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _release(self, req: Request, status: RequestStatus) -> None:
        self.blocks.free(req.all_ids[: req.num_computed], req.block_table)
        req.status = status

    def fail_all(self) -> list[Request]:
        """Finish every request with an error (the forward pass failed); return them."""
        failed = self.running + self.waiting
        self.running, self.waiting = [], []
        for r in failed:
            self._release(r, RequestStatus.FINISHED_ERROR)
        return failed

"""Scheduler: continuous batching under a sequence cap and a per-step token budget.

Each step: running decodes first (one token each), then prefill chunks of running requests,
then new requests by priority, then speculative drafts for the decodes from whatever budget
and free slots are left (so drafting never delays anyone). When blocks run out a decode
preempts the lowest-priority, newest running request (recompute: its blocks are freed,
their full blocks stay in the prefix cache, and it waits at the head of its priority).

The scheduler holds the one registry of live requests (`requests`, by id); `waiting` and
`running` are its two queues. After the forward pass, `update_from_output` records what each
scheduled sequence emitted and returns the step's events, grouped by the frontend to tell.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from enginecore.batch import Batch, SeqChunk
from enginecore.block_manager import BlockManager
from enginecore.request import FINISH_REASON, Request, RequestStatus
from enginecore.sampler import Sampled, SampleSeq
from enginecore.spec import NgramProposer, drafts_allowed, record_verification
from shared.protocol import FinishReason, TokenEvent, TokenLogprob

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_chunk: int  # 0 = whole prompts (still within the token budget)
    max_model_len: int
    queue_capacity: int


class ScheduledSeq(NamedTuple):
    """One sequence of a step: its request, the chunk it feeds, and the drafts in that chunk."""

    req: Request
    chunk: SeqChunk
    drafts: list[int]  # speculative tokens fed after the last real one ([] if none)


class Scheduled(NamedTuple):
    batch: Batch
    seqs: list[ScheduledSeq]  # in the order of the batch's sequences

    def sampling(self) -> list[SampleSeq]:
        """What the sampler needs of each sequence, in batch order."""
        return [SampleSeq(s.req, s.chunk.num_sample, s.drafts) for s in self.seqs]


Events = dict[bytes, list[TokenEvent]]  # frontend identity -> its requests' events


class Scheduler:
    def __init__(
        self, cfg: SchedulerConfig, blocks: BlockManager, proposer: NgramProposer | None
    ) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.proposer = proposer
        self.requests: dict[str, Request] = {}  # every live request, by id
        self.waiting: dict[str, Request] = {}  # admitted, not running (new or preempted)
        self.running: dict[str, Request] = {}
        self.preemptions_total = 0
        self.spec_proposed_total = 0  # drafts verified
        self.spec_accepted_total = 0

    # ---- admission -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.requests)

    def queue_full(self) -> bool:
        return sum(1 for r in self.waiting.values() if not r.started) >= self.cfg.queue_capacity

    def add(self, req: Request) -> None:
        assert req.rid not in self.requests, req.rid
        self.requests[req.rid] = req
        self.waiting[req.rid] = req

    def expire(self, now: float) -> list[Request]:
        """Remove and return requests that waited past their deadline without ever starting."""
        late = [
            r
            for r in self.waiting.values()
            if not r.started and r.deadline is not None and now > r.deadline
        ]
        for r in late:
            del self.waiting[r.rid], self.requests[r.rid]
        return late

    def abort(self, rid: str) -> Request | None:
        """Finish `rid` as aborted and free its blocks; None if it is not live."""
        return self.finish(rid, RequestStatus.FINISHED_ABORTED)

    def finish(self, rid: str, status: RequestStatus) -> Request | None:
        """End `rid` now with `status` and free its blocks; None if it is not live."""
        assert status.is_finished, status
        req = self.requests.pop(rid, None)
        if req is not None:
            self.waiting.pop(rid, None)
            self.running.pop(rid, None)
            self._release(req, status)
        return req

    def fail(self, scheduled: Scheduled) -> Events:
        """The step's forward pass failed: each of its requests ends with an error."""
        events: Events = defaultdict(list)
        for seq in scheduled.seqs:
            if self.finish(seq.req.rid, RequestStatus.FINISHED_ERROR) is not None:
                events[seq.req.client].append(_event(seq.req, [], FinishReason.ERROR))
        return events

    # ---- one step ------------------------------------------------------------------------

    def schedule(self, reserve: int = 0) -> Scheduled | None:
        """This step's batch; `reserve` tokens of the budget are kept for other work (an
        embedding chunk), which takes them like one more prefill chunk would."""
        budget = self.cfg.max_num_batched_tokens - reserve
        chosen: dict[str, ScheduledSeq] = {}  # by rid, in batch order
        by_priority = sorted(self.running.values(), key=lambda r: (-r.priority, r.arrival))
        # 1. decodes of running requests (their prompts are done), highest priority, oldest first
        for req in by_priority:
            if req.is_prefilling or req.status != RequestStatus.RUNNING or budget < 1:
                continue
            if not self._reserve(req, req.num_tokens, chosen):
                continue
            chunk = SeqChunk([req.last_token], req.num_computed, self.blocks.table(req.rid), 1)
            chosen[req.rid] = ScheduledSeq(req, chunk, [])
            budget -= 1
        decodes = list(chosen)
        # 2. prefill chunks of running requests, then 3. waiting requests by priority
        for req in by_priority:
            if req.is_prefilling and req.status == RequestStatus.RUNNING:
                budget = self._schedule_prefill(req, budget, chosen)
        for req in sorted(self.waiting.values(), key=lambda r: (-r.priority, r.arrival)):
            if len(self.running) >= self.cfg.max_num_seqs or budget <= 0:
                break
            cached = self.blocks.allocate(req.rid, req.all_ids, self._chunk_len(budget))
            if cached is None:
                break
            del self.waiting[req.rid]
            req.num_computed = cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = cached
            req.status = RequestStatus.RUNNING
            self.running[req.rid] = req
            budget = self._schedule_prefill(req, budget, chosen)
        # 4. speculative drafts for the decodes, from the budget left: never at the expense of a
        # decode or a prompt, and never by preemption (drafts that do not fit are dropped)
        for rid in decodes:
            req, chunk, _ = chosen[rid]
            drafts = self._drafts(req, budget)
            if drafts and self.blocks.append_slots(rid, req.num_tokens + len(drafts)):
                tokens = [req.last_token, *drafts]
                chunk = SeqChunk(tokens, chunk.start_pos, self.blocks.table(rid), len(tokens))
                chosen[rid] = ScheduledSeq(req, chunk, drafts)
                budget -= len(drafts)
        if not chosen:
            return None
        seqs = list(chosen.values())
        return Scheduled(Batch.build([s.chunk for s in seqs], self.blocks.block_size), seqs)

    def _chunk_len(self, budget: int) -> int:
        return min(budget, self.cfg.prefill_chunk) if self.cfg.prefill_chunk else budget

    def _schedule_prefill(self, req: Request, budget: int, chosen: dict[str, ScheduledSeq]) -> int:
        remaining = req.num_tokens - req.num_computed
        n = min(remaining, self._chunk_len(budget))
        if n <= 0 or not self._reserve(req, req.num_computed + n, chosen):
            return budget
        tokens = req.all_ids[req.num_computed : req.num_computed + n]
        table = self.blocks.table(req.rid)
        chunk = SeqChunk(tokens, req.num_computed, table, 1 if n == remaining else 0)
        chosen[req.rid] = ScheduledSeq(req, chunk, [])
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

    def _reserve(self, req: Request, num_tokens: int, chosen: dict[str, ScheduledSeq]) -> bool:
        """Grow req's table to num_tokens slots, preempting others not yet in this step's batch.

        The victim is the lowest-priority, newest such request, possibly req itself (False).
        """
        while not self.blocks.append_slots(req.rid, num_tokens):
            victim = min(
                (r for r in self.running.values() if r.rid not in chosen),
                key=lambda r: (r.priority, -r.arrival),
            )
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        del self.running[req.rid]
        self.blocks.free(req.rid, req.all_ids[: req.num_computed])
        req.num_computed = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting[req.rid] = req

    # ---- after the forward pass ----------------------------------------------------------

    def update_from_output(self, scheduled: Scheduled, sampled: list[Sampled]) -> Events:
        """Record each sequence's computed chunk and new tokens; return the step's events.

        sampled[i] is what sequence i emits this step: nothing mid-prompt, one token, or the
        accepted drafts plus a correction/bonus token. Finished requests leave the registry.
        """
        events: Events = defaultdict(list)
        for (req, chunk, drafts), out in zip(scheduled.seqs, sampled, strict=True):
            if req.status != RequestStatus.RUNNING:
                continue
            if out.failed:
                log.error("request %s failed in sampling: it ends with an error", req.rid)
                self.finish(req.rid, RequestStatus.FINISHED_ERROR)
                events[req.client].append(_event(req, [], FinishReason.ERROR))
                continue
            new = out.token_ids
            # fed tokens are computed, except drafts beyond the accepted ones
            full_before = req.num_computed // self.blocks.block_size
            req.num_computed += len(chunk.token_ids) - len(drafts) + max(len(new) - 1, 0)
            if drafts and self.proposer is not None:
                self.spec_proposed_total += len(drafts)
                self.spec_accepted_total += len(new) - 1
                record_verification(req, len(drafts), len(new) - 1, self.proposer.num_tokens)
            emitted = 0
            status = None
            for token in new:
                req.output_ids.append(token)
                emitted += 1
                status = self._finish_status(req, token)
                if status is not None:
                    self.finish(req.rid, status)
                    break
            else:  # publish blocks this step filled (no O(context) copy on the other steps)
                if req.num_computed // self.blocks.block_size > full_before:
                    self.blocks.cache_full_blocks(req.rid, req.all_ids[: req.num_computed])
            if emitted or status is not None:
                finish = None if status is None else FINISH_REASON[status]
                logprobs = None if out.logprobs is None else out.logprobs[:emitted]
                events[req.client].append(_event(req, new[:emitted], finish, logprobs))
        return events

    def _finish_status(self, req: Request, token: int) -> RequestStatus | None:
        if token in req.stop_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.cfg.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _release(self, req: Request, status: RequestStatus) -> None:
        self.blocks.free(req.rid, req.all_ids[: req.num_computed])
        req.status = status


def _event(
    req: Request,
    token_ids: list[int],
    finish: FinishReason | None,
    logprobs: list[TokenLogprob] | None = None,
) -> TokenEvent:
    return TokenEvent(
        rid=req.rid,
        token_ids=token_ids,
        finish=finish,
        num_prompt_tokens=len(req.prompt_ids),
        num_cached_tokens=req.num_cached_tokens,
        logprobs=logprobs,
    )

"""Scheduler: continuous batching under a sequence cap and a per-step token budget.

Each step: running decodes first (one token each), then prefill chunks of running requests,
then new requests by priority, then speculative drafts for the decodes from whatever budget
and free slots are left (so drafting never delays anyone). When blocks run out a decode
preempts the lowest-priority, newest running request (recompute: its blocks are freed,
their full blocks stay in the prefix cache, and it waits at the head of its priority).

The scheduler holds the one registry of live requests (`requests`, by id); `waiting` and
`running` are its two queues. After the forward pass, `update_from_output` records what each
scheduled sequence emitted and returns the step's events, grouped by the frontend to tell.

Choices (a Submit with n > 1) prefill once. The other choices wait while choice 0 waits or
prefills; the step that computes its prompt's last chunk also samples their first tokens from
that chunk's last row (they "ride" it, as far as free sequence slots allow), and after the
forward pass each forks choice 0's table: the published prompt blocks are shared, the partial
one is copied (`copies`, for the runner). A choice that missed the ride is admitted as any
request is, once choice 0's prompt is computed: the prefix cache then holds the prompt's full
blocks. A request whose prompt logprobs are asked for is computed whole (no prefix hit) and
every row of its prompt chunks is kept: row p scores prompt token p + 1.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
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
    # other choices sampling their first token from the last row of seqs[i] (choice 0's
    # prompt), after every sequence's rows, in this order
    riders: tuple[tuple[int, Request], ...] = ()

    def sampling(self) -> list[SampleSeq]:
        """What the sampler needs of each sequence, in batch order, then of each rider."""
        out = []
        for req, chunk, drafts in self.seqs:
            scored: list[int] = []
            if req.scores_prompt:  # row p scores prompt token p + 1
                start = chunk.start_pos + 1
                scored = req.prompt_ids[start : start + len(chunk.token_ids)]
            out.append(SampleSeq(req, chunk.num_sample, drafts, scored, req.grammar))
        return out + [SampleSeq(rider, 1, [], (), rider.grammar) for _, rider in self.riders]


Events = dict[bytes, list[TokenEvent]]  # frontend identity -> its requests' events


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        blocks: BlockManager,
        proposer: NgramProposer | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.proposer = proposer
        self.clock = clock  # the engine's: queue and prefill times of the events
        self.requests: dict[str, Request] = {}  # every live request, by id
        self.waiting: dict[str, Request] = {}  # admitted, not running (new or preempted)
        self.running: dict[str, Request] = {}
        self.choices: dict[str, list[str]] = {}  # submitted rid -> the ids of its live choices
        # KV blocks (source, destination) that forks took: copied by the runner after the
        # forward pass that computed the sources (Engine.step)
        self.copies: list[tuple[int, int]] = []
        self.preemptions_total = 0
        self.spec_proposed_total = 0  # drafts verified
        self.spec_accepted_total = 0
        self.spec_drafts_total = 0  # sequence steps that verified drafts
        self.prefill_tokens_total = 0  # prompt positions computed (hits and forks aside)
        self.admitted_total = 0  # requests scheduled for the first time

    # ---- admission -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.requests)

    def queue_full(self, num_new: int = 1) -> bool:
        """Whether `num_new` more waiting requests would overflow the queue."""
        waiting = sum(1 for r in self.waiting.values() if not r.started)
        return waiting + num_new > self.cfg.queue_capacity

    def add(self, req: Request) -> None:
        assert req.rid not in self.requests, req.rid
        self.requests[req.rid] = req
        self.waiting[req.rid] = req
        self.choices.setdefault(req.submit_rid, []).append(req.rid)

    def choices_of(self, rid: str) -> list[str]:
        """The ids of the live choices of the request submitted as `rid`."""
        return list(self.choices.get(rid, ()))

    def expire(self, now: float) -> list[Request]:
        """Remove and return requests that waited past their deadline without ever starting."""
        late = [
            r
            for r in self.waiting.values()
            if not r.started and r.deadline is not None and now > r.deadline
        ]
        for r in late:
            del self.waiting[r.rid]
            self._forget(r)
        return late

    def _forget(self, req: Request) -> None:
        del self.requests[req.rid]
        live = self.choices[req.submit_rid]
        live.remove(req.rid)
        if not live:
            del self.choices[req.submit_rid]

    def abort(self, rid: str) -> Request | None:
        """Finish `rid` as aborted and free its blocks; None if it is not live."""
        return self.finish(rid, RequestStatus.FINISHED_ABORTED)

    def finish(self, rid: str, status: RequestStatus) -> Request | None:
        """End `rid` now with `status` and free its blocks; None if it is not live."""
        assert status.is_finished, status
        req = self.requests.get(rid)
        if req is not None:
            self._forget(req)
            self.waiting.pop(rid, None)
            self.running.pop(rid, None)
            self._release(req, status)
        return req

    def fail(self, scheduled: Scheduled) -> Events:
        """The step's forward pass failed: each of its requests ends with an error."""
        events: Events = defaultdict(list)
        for seq in scheduled.seqs:
            if self.finish(seq.req.rid, RequestStatus.FINISHED_ERROR) is not None:
                events[seq.req.client].append(self._event(seq.req, [], FinishReason.ERROR))
        return events

    # ---- one step ------------------------------------------------------------------------

    def schedule(self, reserve: int = 0) -> Scheduled | None:
        """This step's batch; `reserve` tokens of the budget are kept for other work (an
        embedding chunk), which takes them like one more prefill chunk would."""
        budget = self.cfg.max_num_batched_tokens - reserve
        chosen: dict[str, ScheduledSeq] = {}  # by rid, in batch order
        riders: list[tuple[int, Request]] = []
        by_priority = sorted(self.running.values(), key=lambda r: (-r.priority, r.arrival))
        # 1. decodes of running requests (their prompts are done), highest priority, oldest first
        for req in by_priority:
            if req.is_prefilling or req.status != RequestStatus.RUNNING or budget < 1:
                continue
            if not self._reserve(req, req.num_tokens, chosen):
                continue
            chunk = SeqChunk([req.last_token], req.num_computed, self.blocks.table(req.rid), 1)
            chosen[req.rid] = ScheduledSeq(req, chunk, [])
            self._count_prefill(req, 1)
            budget -= 1
        decodes = list(chosen)
        # 2. prefill chunks of running requests, then 3. waiting requests by priority
        for req in by_priority:
            if req.is_prefilling and req.status == RequestStatus.RUNNING:
                budget = self._schedule_prefill(req, budget, chosen, riders)
        riding = {rider.rid for _, rider in riders}
        for req in sorted(self.waiting.values(), key=lambda r: (-r.priority, r.arrival)):
            if len(self.running) + len(riders) >= self.cfg.max_num_seqs or budget <= 0:
                break
            if req.rid in riding or self._waits_for_leader(req):
                continue
            cached = self.blocks.allocate(
                req.rid,
                req.all_ids,
                self._chunk_len(budget),
                salt=req.cache_salt,
                match_prefix=not req.scores_prompt,
            )
            if cached is None:
                break
            del self.waiting[req.rid]
            req.num_computed = cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = cached
                req.scheduled_at = self.clock()
                self.admitted_total += 1
            req.status = RequestStatus.RUNNING
            self.running[req.rid] = req
            budget = self._schedule_prefill(req, budget, chosen, riders)
            riding.update(rider.rid for _, rider in riders)
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
        repeat = [i for i, _ in riders]
        batch = Batch.build([s.chunk for s in seqs], self.blocks.block_size, repeat)
        return Scheduled(batch, seqs, tuple(riders))

    def _chunk_len(self, budget: int) -> int:
        return min(budget, self.cfg.prefill_chunk) if self.cfg.prefill_chunk else budget

    def _count_prefill(self, req: Request, n: int) -> None:
        """Count the prompt positions among the next n computed tokens of req."""
        self.prefill_tokens_total += max(0, min(n, len(req.prompt_ids) - req.num_computed))

    def _waits_for_leader(self, req: Request) -> bool:
        """A choice waits while choice 0 waits or prefills: its prompt is computed once."""
        leader = self.requests.get(req.leader) if req.leader is not None else None
        return leader is not None and (
            leader.status != RequestStatus.RUNNING or leader.is_prefilling
        )

    def _schedule_prefill(
        self,
        req: Request,
        budget: int,
        chosen: dict[str, ScheduledSeq],
        riders: list[tuple[int, Request]],
    ) -> int:
        remaining = req.num_tokens - req.num_computed
        n = min(remaining, self._chunk_len(budget))
        if n <= 0 or not self._reserve(req, req.num_computed + n, chosen):
            return budget
        tokens = req.all_ids[req.num_computed : req.num_computed + n]
        table = self.blocks.table(req.rid)
        last = n == remaining
        # a prompt that is scored keeps every row; otherwise only the last chunk's last
        num_sample = n if req.scores_prompt else int(last)
        if last and not req.output_ids:  # the other choices waiting for this prompt ride along
            for rid in req.siblings:
                rider = self.waiting.get(rid)
                seats = self.cfg.max_num_seqs - len(self.running) - len(riders)
                if rider is not None and rider.status == RequestStatus.WAITING and seats > 0:
                    riders.append((len(chosen), rider))
        chosen[req.rid] = ScheduledSeq(
            req, SeqChunk(tokens, req.num_computed, table, num_sample), []
        )
        self._count_prefill(req, n)
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
        drafts = self.proposer.propose(req.all_ids)[: min(room, drafts_allowed(req))]
        if req.grammar is not None and drafts:
            del drafts[req.grammar.valid_prefix(drafts) :]  # a draft it forbids is never accepted
        return drafts

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
        if req.scores_prompt:
            req.prompt_logprobs.clear()  # scored again from the start
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
        accepted drafts plus a correction/bonus token; then one token per rider. Finished
        requests leave the registry.
        """
        events: Events = defaultdict(list)
        num_seqs = len(scheduled.seqs)
        riders: dict[int, list[tuple[Request, Sampled]]] = defaultdict(list)
        for (i, rider), out in zip(scheduled.riders, sampled[num_seqs:], strict=True):
            riders[i].append((rider, out))
        for i, ((req, chunk, drafts), out) in enumerate(
            zip(scheduled.seqs, sampled[:num_seqs], strict=True)
        ):
            if req.status != RequestStatus.RUNNING:
                continue
            if out.failed:
                log.error("request %s failed in sampling: it ends with an error", req.rid)
                self.finish(req.rid, RequestStatus.FINISHED_ERROR)
                events[req.client].append(self._event(req, [], FinishReason.ERROR))
                continue
            new = out.token_ids
            req.prompt_logprobs += out.prompt_logprobs or ()
            # fed tokens are computed, except drafts beyond the accepted ones
            full_before = req.num_computed // self.blocks.block_size
            req.num_computed += len(chunk.token_ids) - len(drafts) + max(len(new) - 1, 0)
            if drafts and self.proposer is not None:
                self.spec_drafts_total += 1
                self.spec_proposed_total += len(drafts)
                self.spec_accepted_total += len(new) - 1
                record_verification(req, len(drafts), len(new) - 1, self.proposer.num_tokens)
            # riders fork before choice 0 may finish, but are told after it: its first event,
            # which holds the prompt logprobs, comes before any other choice's
            seated = self._seat_riders(req, riders[i]) if new and i in riders else []
            if new and req.params.max_tokens == 0:  # a prompt to score, nothing to generate
                self.finish(req.rid, RequestStatus.FINISHED_LENGTH)
                events[req.client].append(self._event(req, [], FinishReason.LENGTH))
            else:
                self._append(req, new, out.logprobs, full_before, events)
            events[req.client] += seated
        return events

    def _append(
        self,
        req: Request,
        new: list[int],
        logprobs: list[TokenLogprob] | None,
        full_before: int,
        events: Events,
    ) -> None:
        """Append new tokens up to a finish; publish the blocks they filled; tell the frontend."""
        emitted = 0
        status = None
        for token in new:
            req.output_ids.append(token)
            emitted += 1
            status = self._finish_status(req, token)
            if status is not None:
                break
        if new and emitted == len(new) and req.grammar is not None and req.grammar.is_complete:
            status = RequestStatus.FINISHED_STOPPED  # the document is whole, even at max_tokens
        if status is not None:
            self.finish(req.rid, status)
        elif req.num_computed // self.blocks.block_size > full_before:
            # publish blocks this step filled (no O(context) copy on the other steps)
            self.blocks.cache_full_blocks(req.rid, req.all_ids[: req.num_computed])
        if emitted or status is not None:
            finish = None if status is None else FINISH_REASON[status]
            logprobs = None if logprobs is None else logprobs[:emitted]
            events[req.client].append(self._event(req, new[:emitted], finish, logprobs))

    def _seat_riders(
        self, leader: Request, riders: list[tuple[Request, Sampled]]
    ) -> list[TokenEvent]:
        """Choice 0's prompt is computed: the choices that rode its last row take their first
        token and fork its table (a rider the pool cannot hold waits as if preempted); their
        events are returned."""
        num_prompt = len(leader.prompt_ids)
        self.blocks.cache_full_blocks(leader.rid, leader.prompt_ids)  # shared, not copied
        now = self.clock()
        seated: Events = defaultdict(list)
        for rider, out in riders:
            if self.waiting.get(rider.rid) is not rider or out.failed:
                continue  # gone meanwhile, or its sampling failed: it is admitted later
            del self.waiting[rider.rid]
            rider.scheduled_at = now
            self.admitted_total += 1
            if rider.params.max_tokens == 0:  # scored with choice 0, nothing to generate
                self.finish(rider.rid, RequestStatus.FINISHED_LENGTH)
                seated[rider.client].append(self._event(rider, [], FinishReason.LENGTH))
                continue
            copies = self.blocks.fork(leader.rid, rider.rid, num_prompt)
            if copies is None:
                rider.status = RequestStatus.PREEMPTED
                rider.num_preemptions += 1
                self.waiting[rider.rid] = rider
            else:
                self.copies += copies
                rider.num_computed = num_prompt
                rider.status = RequestStatus.RUNNING
                self.running[rider.rid] = rider
            full = num_prompt // self.blocks.block_size
            self._append(rider, out.token_ids, out.logprobs, full, seated)
        return seated[leader.client]

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) KV block copies taken since the last call: by partial
        prefix hits when scheduling (to be made before that step's forward pass) and by forks
        after it (before the next one)."""
        copies, self.copies = self.blocks.take_copies() + self.copies, []
        return copies

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
        self,
        req: Request,
        token_ids: list[int],
        finish: FinishReason | None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> TokenEvent:
        event = TokenEvent(
            rid=req.submit_rid,
            token_ids=token_ids,
            finish=finish,
            num_prompt_tokens=len(req.prompt_ids),
            num_cached_tokens=req.num_cached_tokens,
            logprobs=logprobs,
            index=req.index,
        )
        if not req.reported:  # the choice's first event
            req.reported = True
            if req.params.prompt_logprobs is not None:
                event.prompt_logprobs = req.prompt_logprobs
            if req.scheduled_at is not None:
                event.queue_s = req.scheduled_at - req.arrival
                event.prefill_s = self.clock() - req.scheduled_at
        return event

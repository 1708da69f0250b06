"""Engine: the core's loop. Take messages, drop aborted work, schedule, forward, sample, send."""

from __future__ import annotations

import hmac
import logging
import time
from collections import defaultdict

import msgspec

from enginecore.block_manager import BlockManager
from enginecore.channel import Channel
from enginecore.embedder import Embedder
from enginecore.grammar import Grammar, GrammarCompiler
from enginecore.logits_mask import LogitsMasker
from enginecore.model_runner import ModelRunner
from enginecore.queue_rate import MIN_RETRY_S, QueueRate
from enginecore.request import (
    Request,
    RequestStatus,
    choice_rid,
    invalid_submit,
    with_choices,
)
from enginecore.sampler import Sampler, make_generator
from enginecore.scheduler import Events, Scheduled, Scheduler
from shared.eos import stop_token_ids
from shared.grammar import GrammarError
from shared.protocol import (
    MAX_CHOICES,
    Abort,
    Accepted,
    Bye,
    Embed,
    FinishReason,
    GetStats,
    Heartbeat,
    Hello,
    Rejected,
    RejectReason,
    SamplingParams,
    Shutdown,
    ShutdownCore,
    Stats,
    Step,
    Submit,
    ToCore,
    TokenEvent,
    Welcome,
)

log = logging.getLogger(__name__)
IDLE_POLL_MS = 500  # how often an idle core wakes to check client liveness
# a forward pass that raises fails its step's requests and the loop goes on; this many failed
# steps in a row mean the core itself is broken: it exits non-zero, to be respawned
MAX_FAILED_STEPS = 3


class Engine:
    def __init__(
        self,
        channel: Channel,
        runner: ModelRunner,
        scheduler: Scheduler,
        sampler: Sampler,
        welcome: Welcome,
        client_timeout_s: float,
        queue_deadline_ms: int,
        step_delay_ms: int,
        drain_timeout_s: float = 30.0,
        owner_token: str = "",
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.channel = channel
        self.runner = runner
        self.scheduler = scheduler
        self.blocks: BlockManager = scheduler.blocks
        self.sampler = sampler
        self.grammars = grammars  # None: a core that refuses constrained requests
        self.masker = LogitsMasker(welcome.vocab_size)
        self.embedder = Embedder(runner, scheduler.blocks, welcome.max_model_len)
        self.welcome = welcome
        self.eos_ids = frozenset(welcome.eos_ids)
        self.client_timeout_s = client_timeout_s
        self.queue_deadline_ms = queue_deadline_ms
        self.step_delay_s = step_delay_ms / 1000
        self.clients: dict[bytes, float] = {}  # identity -> last time heard from
        self.requests = scheduler.requests  # every live request, by id (the scheduler's)
        self.draining = False
        self.drain_timeout_s = drain_timeout_s
        self.owner_token = owner_token  # what ShutdownCore must carry: the spawner's secret
        self.drain_deadline = float("inf")  # past it, a drain cuts what is still running
        self.batch_tokens = 0
        self.steps_total = 0
        self.failed_steps = 0  # consecutive steps whose forward pass raised
        self.queue_rate = QueueRate(time.monotonic())

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until drained; 0 after a drain, 1 after a fatal error (frontends are told)."""
        try:
            while not (self.draining and not self.has_work()):
                self.turn()
        except Exception as e:
            log.exception("fatal error in the engine loop")
            self.broadcast(Shutdown(reason=f"engine core failed: {e}", fatal=True))
            return 1
        self.broadcast(Shutdown(reason="drained", fatal=False))
        return 0

    def turn(self) -> None:
        """One pass: every pending message, liveness and deadlines, then a step if there is work."""
        busy = self.has_work()
        messages = self.channel.recv_all(0 if busy else IDLE_POLL_MS)
        # not reading from here to the next recv_all: frontends hear Busy if it takes long
        with self.channel.busy(self.clients):
            for client, msg in messages:
                try:
                    self.handle(client, msg)
                except Exception:
                    # one message's failure is that request's, never the loop's
                    log.exception("failed on a %s from %r", type(msg).__name__, client)
                    if isinstance(msg, Submit | Embed):
                        self.refuse_failed(client, msg.rid)
        # after the messages: a frontend's heartbeats sent during a long step count as heard
        self.check_clients()
        self.expire_waiting()
        self.cut_overdue_drain()
        if self.has_work():
            with self.channel.busy(self.clients):
                self.step()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.embedder.has_work()

    def drain(self) -> None:
        """Admit nothing new; the loop exits when running and waiting work is done, or after
        drain_timeout_s, when what is left ends with finish reason `abort`."""
        if not self.draining:
            log.info(
                "draining: %d running, %d waiting, for at most %.0f s",
                len(self.scheduler.running),
                len(self.scheduler.waiting),
                self.drain_timeout_s,
            )
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
        self.draining = True

    def cut_overdue_drain(self) -> None:
        if not self.has_work() or time.monotonic() < self.drain_deadline:
            return
        log.warning(
            "drain timeout: aborting %d unfinished requests",
            len(self.requests) + len(self.embedder.jobs),
        )
        cut: Events = defaultdict(list)
        for rid, req in list(self.requests.items()):
            cut[req.client].append(
                TokenEvent(req.submit_rid, [], FinishReason.ABORT, index=req.index)
            )
            self.scheduler.abort(rid)
        self.send_events(cut)
        for rid, job in list(self.embedder.jobs.items()):
            self.embedder.drop(rid)
            why = "the engine core is shutting down"
            self.reject(job.client, rid, RejectReason.SHUTTING_DOWN, why)

    def broadcast(self, msg: Shutdown) -> None:
        for client in self.clients:
            self.channel.send(client, msg)

    # ---- messages ------------------------------------------------------------------------

    def handle(self, client: bytes, msg: ToCore) -> None:
        self.clients[client] = time.monotonic()
        match msg:
            case Hello():
                self.channel.send(client, self.welcome)
            case Submit():
                self.submit(client, msg)
            case Abort(rids=rids, index=index):
                for rid in rids:
                    self.abort(rid, client, index)
            case Embed():
                self.embed(client, msg)
            case GetStats():
                self.channel.send(client, self.stats())
            case Heartbeat():
                pass
            case Bye():
                self.forget(client)
            case ShutdownCore(token=token):
                if self.owner_token and hmac.compare_digest(token, self.owner_token):
                    self.drain()
                else:
                    log.warning("ignored a ShutdownCore from %r: not the spawning frontend", client)

    def submit(self, client: bytes, msg: Submit) -> None:
        """Queue the request's n choices, then say Accepted."""
        reason = self.refusal(msg)
        if reason is not None:
            self.reject(client, msg.rid, *reason)
            return
        p = msg.params
        try:  # each choice follows the grammar on its own
            grammars = [self.compile_grammar(p) for _ in range(msg.n)]
        except GrammarError as e:
            self.reject(client, msg.rid, RejectReason.INVALID, f"grammar: {e}")
            return
        now = time.monotonic()
        deadline_ms = msg.deadline_ms if msg.deadline_ms is not None else self.queue_deadline_ms
        stop_ids = stop_token_ids(self.eos_ids, p.stop_token_ids, p.ignore_eos)
        # every id that ends the request: min_tokens masks exactly these
        params = msgspec.structs.replace(p, stop_token_ids=stop_ids)
        first = Request(
            rid=msg.rid,
            client=client,
            prompt_ids=list(msg.prompt_ids),
            params=params,
            stop_ids=frozenset(stop_ids),
            priority=msg.priority,
            arrival=now,
            deadline=now + deadline_ms / 1000 if deadline_ms > 0 else None,
            generator=make_generator(p.seed),
            cache_salt=msg.cache_salt,
        )
        for req, grammar in zip(with_choices(first, msg.n), grammars, strict=True):
            req.grammar = grammar
            self.scheduler.add(req)
        self.channel.send(client, Accepted(msg.rid))

    def compile_grammar(self, p: SamplingParams) -> Grammar | None:
        """The matcher of a constrained request (None if unconstrained); GrammarError if refused."""
        if p.grammar is None:
            return None
        if self.grammars is None:
            raise GrammarError("this engine core serves no grammars")
        return self.grammars.compile(p.grammar)

    def refusal(self, msg: Submit) -> tuple[RejectReason, str] | None:
        if self.draining:
            return RejectReason.SHUTTING_DOWN, "the engine core is shutting down"
        if not 1 <= msg.n <= MAX_CHOICES:
            return RejectReason.INVALID, f"n must be in [1, {MAX_CHOICES}]"
        if msg.rid in self.scheduler.choices or any(
            choice_rid(msg.rid, i) in self.requests for i in range(msg.n)
        ):
            return RejectReason.INVALID, f"request id {msg.rid!r} is already in use"
        w = self.welcome
        if bad := invalid_submit(msg.prompt_ids, msg.params, w.max_model_len, w.vocab_size):
            return bad
        if (
            self.blocks.blocks_needed(len(msg.prompt_ids) + msg.params.max_tokens)
            > self.blocks.num_blocks
        ):
            return RejectReason.NO_CAPACITY, "the KV cache is too small for this request"
        if msg.n > self.scheduler.cfg.queue_capacity:
            return RejectReason.INVALID, "n is more than the admission queue holds"
        if self.scheduler.queue_full(msg.n):
            return RejectReason.QUEUE_FULL, "the admission queue is full"
        return None

    def reject(self, client: bytes, rid: str, reason: RejectReason, message: str) -> None:
        """Refuse `rid`; a refusal that waiting may cure says when to retry."""
        retry_after_s = 0
        if reason in (RejectReason.QUEUE_FULL, RejectReason.NO_CAPACITY):
            retry_after_s = self.queue_rate.retry_after_s(
                time.monotonic(), self.scheduler.queue_depth
            )
        elif reason is RejectReason.SHUTTING_DOWN:
            retry_after_s = MIN_RETRY_S  # a replacement may serve it already
        self.channel.send(client, Rejected(rid, reason, message, retry_after_s))

    def refuse_failed(self, client: bytes, rid: str) -> None:
        """The core failed while taking `rid`: drop whatever it made of it and say so."""
        for key in self.scheduler.choices_of(rid):
            if self.requests[key].client == client:
                self.scheduler.finish(key, RequestStatus.FINISHED_ERROR)
        self.embedder.drop(rid, client)
        self.channel.send(
            client, Rejected(rid, RejectReason.INTERNAL, "the engine core failed on this request")
        )

    def abort(self, rid: str, client: bytes, index: int | None = None) -> None:
        """Drop a request of `client`'s (every choice, or choice `index`); another frontend's
        request of that id is left alone."""
        for key in self.scheduler.choices_of(rid):
            req = self.requests[key]
            if req.client == client and index in (None, req.index):
                self.scheduler.abort(key)
        self.embedder.drop(rid, client)

    def forget(self, client: bytes) -> None:
        """A frontend left or went silent: abort everything it owns."""
        self.clients.pop(client, None)
        for rid in [rid for rid, r in self.requests.items() if r.client == client]:
            self.scheduler.abort(rid)
        self.embedder.forget(client)

    def check_clients(self) -> None:
        cutoff = time.monotonic() - self.client_timeout_s
        for client in [c for c, seen in self.clients.items() if seen < cutoff]:
            log.warning(
                "frontend %r silent for %.0f s: aborting its requests",
                client,
                self.client_timeout_s,
            )
            self.forget(client)

    def expire_waiting(self) -> None:
        for req in self.scheduler.expire(time.monotonic()):
            rid = req.submit_rid
            for key in self.scheduler.choices_of(rid):  # its other choices go with it
                self.scheduler.abort(key)
            self.reject(req.client, rid, RejectReason.NO_CAPACITY, "waited too long for capacity")

    # ---- one step ------------------------------------------------------------------------

    def step(self) -> None:
        """Generation first (schedule, forward, sample), then an embedding chunk from the token
        budget it left; each frontend is sent its events and answers."""
        cfg = self.scheduler.cfg
        # embeddings take part of the budget as one more prefill chunk would (decodes first)
        embed_chunk = cfg.prefill_chunk or cfg.max_num_batched_tokens
        reserve = self.embedder.waiting_tokens(embed_chunk)
        scheduled = self.scheduler.schedule(reserve) if self.scheduler.has_work() else None
        used = 0
        if scheduled is not None:
            used = scheduled.batch.num_tokens
            if not self.generate(scheduled):
                return
        budget = min(reserve, cfg.max_num_batched_tokens - used)
        if budget > 0:
            replies, ran = self.embedder.step(budget)
            for client, reply in replies:
                self.channel.send(client, reply)
            used += ran
        if used == 0:
            return
        self.batch_tokens = used
        self.steps_total += 1
        if self.step_delay_s:
            time.sleep(self.step_delay_s)

    def generate(self, scheduled: Scheduled) -> bool:
        """The forward pass and sampling of one scheduled batch; False if the forward failed."""
        copies = self.scheduler.take_copies()
        if copies:  # partial prefix hits of this step: before the forward writes any KV
            self.runner.copy_blocks(copies)
        try:
            logits = self.runner.run(scheduled.batch)
        except Exception:
            self.failed_steps += 1
            log.exception(
                "the forward pass failed (%d in a row): failing the step's %d requests",
                self.failed_steps,
                len(scheduled.seqs),
            )
            self.send_events(self.scheduler.fail(scheduled))
            if self.failed_steps >= MAX_FAILED_STEPS:
                raise
            return False
        self.failed_steps = 0
        seqs = scheduled.sampling()
        self.masker.apply(logits, seqs)  # constrained rows only: before any token is chosen
        sampled = self.sampler.emit(logits, seqs)
        events = self.scheduler.update_from_output(scheduled, sampled)
        copies = self.scheduler.take_copies()
        if copies:  # forks of this step: before anything else writes their sources
            self.runner.copy_blocks(copies)
        self.queue_rate.record(time.monotonic(), self.scheduler.admitted_total)
        self.send_events(events)
        return True

    def send_events(self, events: Events) -> None:
        for client, evs in events.items():
            self.channel.send(client, Step(evs))

    # ---- between steps -------------------------------------------------------------------

    def embed(self, client: bytes, msg: Embed) -> None:
        """Queue an embedding request: its chunks run in the steps to come."""
        reason = (
            (RejectReason.SHUTTING_DOWN, "the engine core is shutting down")
            if self.draining
            else self.embedder.refusal(msg.rid, msg.inputs)
        )
        if reason is not None:
            self.reject(client, msg.rid, *reason)
        else:
            self.embedder.add(msg.rid, client, msg.inputs)

    def stats(self) -> Stats:
        b, g = self.blocks, self.grammars
        return Stats(
            kv_blocks_used=b.num_used,
            kv_blocks_free=b.num_free,
            kv_blocks_cached=b.num_cached,
            queue_depth=self.scheduler.queue_depth,
            active_sequences=len(self.scheduler.running),
            batch_tokens=self.batch_tokens,
            prefix_cache_queries=b.prefix_query_tokens,
            prefix_cache_hits=b.prefix_hit_tokens,
            preemptions_total=self.scheduler.preemptions_total,
            kv_evictions_total=b.evictions_total,
            spec_proposed_total=self.scheduler.spec_proposed_total,
            spec_accepted_total=self.scheduler.spec_accepted_total,
            steps_total=self.steps_total,
            constrained_requests_total=0 if g is None else g.num_compiled,
            grammar_compile_seconds_total=0.0 if g is None else g.compile_seconds_total,
            grammar_masked_steps_total=self.masker.masked_steps_total,
            grammar_mask_seconds_total=self.masker.mask_seconds_total,
            kv_blocks_total=b.num_blocks,
            prefill_tokens_total=self.scheduler.prefill_tokens_total,
            spec_drafts_total=self.scheduler.spec_drafts_total,
        )

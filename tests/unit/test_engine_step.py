"""Engine driven in-process: a fake Channel, a fake clock and the real runner on tiny models.

The succ model makes outputs obvious (byte i is followed by byte i + 1), so speculation,
stops and limits can be checked token by token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

import enginecore.engine as engine_module
from enginecore.batch import Batch
from enginecore.block_manager import BlockManager
from enginecore.engine import Engine
from enginecore.model_runner import ModelRunner
from enginecore.sampler import Sampler
from enginecore.scheduler import Scheduler, SchedulerConfig
from enginecore.spec import NgramProposer
from shared.protocol import (
    Abort,
    FinishReason,
    GetStats,
    Heartbeat,
    Rejected,
    RejectReason,
    SamplingParams,
    Shutdown,
    Stats,
    Step,
    Submit,
    ToCore,
    ToFrontend,
    TokenEvent,
    Welcome,
)
from tests.conftest import TinyModels

FE = b"frontend-1"


@dataclass
class FakeChannel:
    inbox: list[tuple[bytes, ToCore]] = field(default_factory=list)
    sent: list[tuple[bytes, ToFrontend]] = field(default_factory=list)

    def recv_all(self, timeout_ms: int) -> list[tuple[bytes, ToCore]]:
        out, self.inbox = self.inbox, []
        return out

    def send(self, client: bytes, msg: ToFrontend) -> None:
        self.sent.append((client, msg))

    def take(self) -> list[tuple[bytes, ToFrontend]]:
        out, self.sent = self.sent, []
        return out


class Clock:
    """Stands in for the `time` module inside enginecore.engine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Core:
    engine: Engine
    channel: FakeChannel
    clock: Clock

    def send(self, msg: ToCore, client: bytes = FE) -> None:
        self.channel.inbox.append((client, msg))

    def tick(self) -> None:
        """One turn of Engine.run's loop, then the block manager's integrity check."""
        e = self.engine
        for client, msg in self.channel.recv_all(0):
            e.handle(client, msg)
        e.check_clients()
        e.expire_waiting()
        if e.scheduler.has_work():
            e.step()
        e.blocks.check_integrity()

    def events(self, client: bytes = FE) -> list[TokenEvent]:
        return [
            ev
            for c, m in self.channel.sent
            if c == client and isinstance(m, Step)
            for ev in m.events
        ]

    def rejected(self) -> list[Rejected]:
        return [m for _, m in self.channel.sent if isinstance(m, Rejected)]

    def run_until_idle(self, max_ticks: int = 500) -> None:
        for _ in range(max_ticks):
            self.tick()
            if not self.engine.scheduler.has_work() and not self.channel.inbox:
                return
        raise AssertionError("the engine never went idle")

    def stats(self) -> Stats:
        return self.engine.stats()


def make_core(
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spec: bool = False,
    num_blocks: int = 64,
    max_num_seqs: int = 8,
    queue_deadline_ms: int = 60_000,
    client_timeout_s: float = 10.0,
) -> Core:
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", clock)
    runner = ModelRunner.from_path(path, 4, num_blocks, 0, 256)
    blocks = BlockManager(num_blocks, 4, prefix_cache=True)
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=32,
        prefill_chunk=8,
        max_model_len=runner.max_model_len,
        queue_capacity=16,
    )
    proposer = NgramProposer(3, 2, 4) if spec else None
    welcome = Welcome("tiny", runner.max_model_len, runner.cfg.vocab_size, [256, 258], 4, 1)
    channel = FakeChannel()
    engine = Engine(
        channel=channel,  # type: ignore[arg-type]
        runner=runner,
        scheduler=Scheduler(cfg, blocks, proposer),
        sampler=Sampler(runner.cfg.vocab_size),
        welcome=welcome,
        client_timeout_s=client_timeout_s,
        queue_deadline_ms=queue_deadline_ms,
        step_delay_ms=0,
    )
    return Core(engine, channel, clock)


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


COUNTING = [*range(10, 30), *range(10, 14)]  # succ continues 14, 15, ...; lookup drafts agree


def tokens_of(events: list[TokenEvent], rid: str) -> list[int]:
    return [t for ev in events if ev.rid == rid for t in ev.token_ids]


@pytest.mark.parametrize("spec", [False, True])
def test_stop_token_inside_accepted_drafts_ends_the_request_there(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, spec: bool
) -> None:
    core = make_core(tiny.succ, monkeypatch, spec=spec)
    core.send(Submit("stop", COUNTING, greedy(40, stop_token_ids=(19,))))
    core.send(Submit("len", COUNTING, greedy(3)))
    core.run_until_idle()
    events = core.events()
    assert tokens_of(events, "stop") == [14, 15, 16, 17, 18, 19]
    assert tokens_of(events, "len") == [14, 15, 16]
    finish = {ev.rid: ev.finish for ev in events if ev.finish is not None}
    assert finish == {"stop": FinishReason.STOP, "len": FinishReason.LENGTH}
    s = core.stats()
    assert s.kv_blocks_used == 0
    if spec:
        assert s.spec_accepted_total > 0
        assert len([ev for ev in events if ev.rid == "stop"]) < 6  # several tokens per step
    else:
        assert s.spec_proposed_total == 0


@pytest.mark.parametrize("spec", [False, True])
def test_logprobs_come_with_every_token(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, spec: bool
) -> None:
    core = make_core(tiny.succ, monkeypatch, spec=spec)
    core.send(Submit("lp", COUNTING, greedy(10, logprobs=2)))
    core.send(Submit("plain", COUNTING, greedy(10)))
    core.run_until_idle()
    for ev in core.events():
        if ev.rid == "plain":
            assert ev.logprobs is None
            continue
        assert ev.logprobs is not None
        assert [lp.token_id for lp in ev.logprobs] == ev.token_ids
        for lp in ev.logprobs:
            assert len(lp.top) == 2
            assert lp.top[0].token_id == lp.token_id  # greedy: the chosen token is the best
            assert lp.top[0].logprob == lp.logprob <= 0


def test_queue_deadline_follows_the_clock(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch, max_num_seqs=1, queue_deadline_ms=1000)
    core.send(Submit("long", [1, 2, 3], greedy(100, ignore_eos=True)))
    core.tick()
    core.send(Submit("late", [4, 5, 6], greedy(5)))
    core.send(Submit("own", [4, 5, 6], greedy(5, ignore_eos=True), deadline_ms=5000))
    core.tick()
    core.clock.now += 0.9
    core.tick()
    assert core.rejected() == []
    core.clock.now += 0.2
    core.tick()
    assert [(r.rid, r.reason) for r in core.rejected()] == [("late", RejectReason.NO_CAPACITY)]
    core.send(Abort(["long"]))
    core.run_until_idle()
    assert len(tokens_of(core.events(), "own")) == 5  # its own deadline had not passed


def test_a_silent_frontend_is_forgotten(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch, client_timeout_s=10.0)
    other = b"frontend-2"
    core.send(Submit("quiet", [1, 2, 3], greedy(200, ignore_eos=True)))
    core.send(Submit("chatty", [1, 2, 4], greedy(200, ignore_eos=True)), client=other)
    for _ in range(3):
        core.tick()
    for _ in range(12):  # the other frontend heartbeats, this one says nothing for 12 s
        core.clock.now += 1.0
        core.send(Heartbeat(), client=other)
        core.tick()
    assert [r.rid for r in core.engine.scheduler.running] == ["chatty"]
    assert "quiet" not in core.engine.owner
    assert FE not in core.engine.clients
    core.send(Abort(["chatty"]), client=other)
    core.tick()
    assert core.stats().kv_blocks_used == 0


def test_events_go_to_the_owner_only(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("a", [65], greedy(3)))
    core.send(Submit("b", [97], greedy(3)), client=b"fe-b")
    core.send(GetStats(), client=b"fe-b")
    core.run_until_idle()
    assert tokens_of(core.events(), "a") == [66, 67, 68]
    assert tokens_of(core.events(), "b") == []
    assert tokens_of(core.events(b"fe-b"), "b") == [98, 99, 100]
    assert next(type(m) for c, m in core.channel.sent if c == b"fe-b") is Stats


def test_drain_finishes_work_then_says_shutdown(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("running", [65], greedy(5)))
    core.tick()
    core.engine.drain()
    core.send(Submit("refused", [65], greedy(5)))
    assert core.engine.run() == 0
    assert tokens_of(core.events(), "running") == [66, 67, 68, 69, 70]
    assert [(r.rid, r.reason) for r in core.rejected()] == [("refused", RejectReason.SHUTTING_DOWN)]
    assert core.channel.sent[-1] == (FE, Shutdown(reason="drained", fatal=False))


def test_a_failing_step_tells_every_frontend_and_exits_1(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)

    def broken(batch: Batch, return_hidden: bool = False) -> None:
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(core.engine.runner, "run", broken)
    core.send(Heartbeat(), client=b"bystander")
    core.send(Submit("doomed", [65], greedy(5)))
    assert core.engine.run() == 1
    shutdowns = [(c, m) for c, m in core.channel.sent if isinstance(m, Shutdown)]
    assert {c for c, _ in shutdowns} == {FE, b"bystander"}
    assert all(m.fatal and "kernel exploded" in m.reason for _, m in shutdowns)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=3, min_p=1.5),  # nothing left to sample: the loop crashed
        SamplingParams(max_tokens=3, top_p=0.0),
        SamplingParams(max_tokens=3, temperature=float("nan")),
        SamplingParams(max_tokens=3, temperature=-1.0),
        SamplingParams(max_tokens=3, top_k=-2),
        SamplingParams(max_tokens=3, logprobs=-1),
        SamplingParams(max_tokens=3, repetition_penalty=0.0),
        SamplingParams(max_tokens=3, frequency_penalty=float("inf")),
    ],
)
def test_unusable_sampling_params_are_rejected_not_fatal(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, params: SamplingParams
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("bad", [65], params))
    core.send(Submit("good", [65], SamplingParams(max_tokens=3, temperature=0.5, min_p=1.0)))
    core.run_until_idle()
    assert [(r.rid, r.reason) for r in core.rejected()] == [("bad", RejectReason.INVALID)]
    assert tokens_of(core.events(), "good") == [66, 67, 68]  # min_p = 1 keeps only the best

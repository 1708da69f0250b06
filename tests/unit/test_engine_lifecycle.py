"""Engine lifecycle driven in-process: frontends coming and going, ownership, drain, failure."""

from __future__ import annotations

import pytest

from enginecore.batch import Batch
from enginecore.engine import MAX_FAILED_STEPS
from shared.protocol import (
    Abort,
    Accepted,
    FinishReason,
    GetStats,
    Heartbeat,
    RejectReason,
    Shutdown,
    Stats,
    Step,
    Submit,
)
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import FE, greedy, make_core, tokens_of


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
    assert list(core.engine.scheduler.running) == ["chatty"]
    assert "quiet" not in core.engine.requests
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
    # its request was acknowledged at once, then its Stats came, before any step's events
    assert [type(m) for c, m in core.channel.sent if c == b"fe-b"][:2] == [Accepted, Stats]


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


def test_a_core_whose_steps_keep_failing_tells_every_frontend_and_exits_1(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)

    def broken(batch: Batch, return_hidden: bool = False) -> None:
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(core.engine.runner, "run", broken)
    core.send(Heartbeat(), client=b"bystander")
    for i in range(MAX_FAILED_STEPS - 1):  # each failed step fails only its own requests
        core.send(Submit(f"doomed{i}", [65], greedy(5)))
        core.tick()
    core.send(Submit("doomed", [65], greedy(5)))
    assert core.engine.run() == 1  # the last in a row of failed steps ends the core
    shutdowns = [(c, m) for c, m in core.channel.sent if isinstance(m, Shutdown)]
    assert {c for c, _ in shutdowns} == {FE, b"bystander"}
    assert all(m.fatal and "kernel exploded" in m.reason for _, m in shutdowns)


def test_a_frontend_cannot_abort_another_frontends_request(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Submit("mine", [65], greedy(4)))
    core.tick()
    core.send(Abort(["mine"]), client=b"intruder")
    core.run_until_idle()
    assert tokens_of(core.events(), "mine") == [66, 67, 68, 69]
    core.send(Submit("again", [65], greedy(50, ignore_eos=True)))
    core.tick()
    core.send(Abort(["again"]))  # its owner may
    core.tick()
    assert "again" not in core.engine.requests
    assert core.stats().kv_blocks_used == 0


def test_a_drain_past_its_timeout_ends_what_is_left_as_aborted(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch, max_num_seqs=1, drain_timeout_s=5.0)
    core.send(Submit("long", [1, 2, 3], greedy(200, ignore_eos=True)))
    core.send(Submit("queued", [4, 5, 6], greedy(200, ignore_eos=True)), client=b"fe-2")
    core.tick()
    core.engine.drain()
    core.clock.now += 4.9
    core.tick()
    assert set(core.engine.requests) == {"long", "queued"}  # still within the timeout: at work
    assert len(tokens_of(core.events(), "long")) == 2
    core.clock.now += 0.2
    core.tick()
    cut = {
        (c, ev.rid)
        for c, m in core.channel.sent
        if isinstance(m, Step)
        for ev in m.events
        if ev.finish is FinishReason.ABORT
    }
    assert cut == {(FE, "long"), (b"fe-2", "queued")}
    assert not core.engine.scheduler.has_work()
    assert core.stats().kv_blocks_used == 0
    assert core.engine.run() == 0  # nothing left: the loop says Shutdown at once
    assert core.channel.sent[-1] == (b"fe-2", Shutdown(reason="drained", fatal=False))

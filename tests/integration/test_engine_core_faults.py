"""A real `python -m enginecore` process on an ipc socket, driven over the wire protocol: capacity, aborts, faults, drain.

Cores with the same config are shared per module; every wait has a timeout (see processes.py).
The oracle is the float64 reference on the same (dequantized) weights.
"""

from __future__ import annotations

import pytest

from shared.protocol import Bye, FinishReason, RejectReason, Submit
from tests.conftest import TinyModels
from tests.fixtures.engine_cores import (
    SEEDED,
    Reference,
    client_of,
    greedy,
    random_prompt,
    start,
    text,
)
from tests.fixtures.processes import SpawnedCore

pytestmark = pytest.mark.integration


# ---- preemption ----------------------------------------------------------------------------


def test_preempted_requests_resume_with_unchanged_output(
    small_core: SpawnedCore, ref: Reference
) -> None:
    c = client_of(small_core)
    seeded_alone = c.generate("seeded-alone", text("Once upon a time"), SEEDED).token_ids
    prompts = {f"p{i}": random_prompt(20 + i, 12) for i in range(4)}  # 12 + 36 tokens each
    before = c.stats()
    for rid, p in prompts.items():
        c.submit(rid, p, greedy(36, ignore_eos=True))
    c.submit("seeded", text("Once upon a time"), SEEDED)
    outs = c.collect([*prompts, "seeded"])
    after = c.stats()
    assert after.preemptions_total > before.preemptions_total
    for rid, p in prompts.items():
        assert outs[rid].token_ids == ref.greedy(p, 36), rid
    assert outs["seeded"].token_ids == seeded_alone
    assert after.kv_blocks_used == 0
    assert after.kv_blocks_free + after.kv_blocks_cached == 24


def test_a_request_larger_than_the_whole_cache_is_no_capacity(small_core: SpawnedCore) -> None:
    c = client_of(small_core)
    out = c.generate("huge", random_prompt(1, 50), greedy(50))  # 100 slots > 24 blocks of 4
    assert [r.reason for r in out.rejected] == [RejectReason.NO_CAPACITY]
    assert c.embed("huge-embed", [random_prompt(2, 100)]) is None
    assert [r.reason for r in c.outcome("huge-embed").rejected] == [RejectReason.NO_CAPACITY]
    assert len(c.generate("fits", random_prompt(3, 50), greedy(46)).token_ids) > 0


# ---- admission -------------------------------------------------------------------------------


def test_queue_full_is_rejected_at_once(slow_core: SpawnedCore, ref: Reference) -> None:
    c = client_of(slow_core)
    c.submit("runner", text("run"), greedy(1000, ignore_eos=True))  # aborted below
    c.wait_tokens("runner", 1)
    c.submit("waiter", text("wait"), greedy(5, ignore_eos=True), deadline_ms=60_000)
    c.submit("refused", text("no room"), greedy(5, ignore_eos=True))
    refused = c.collect(["refused"], timeout_s=5)["refused"]
    assert [r.reason for r in refused.rejected] == [RejectReason.QUEUE_FULL]
    assert not c.outcome("waiter").done
    c.abort(["runner"])
    waiter = c.collect(["waiter"], timeout_s=10)["waiter"]
    assert waiter.rejected == []
    assert waiter.token_ids == ref.greedy(text("wait"), 5)
    assert c.outcome("runner").finish is None  # an abort is not answered with events


def test_waiting_past_the_deadline_is_no_capacity(slow_core: SpawnedCore) -> None:
    c = client_of(slow_core)
    c.submit("hog", text("hog"), greedy(1000, ignore_eos=True))  # aborted below
    c.wait_tokens("hog", 1)
    c.submit("late", text("late"), greedy(5))
    late = c.collect(["late"], timeout_s=5)["late"]
    assert [r.reason for r in late.rejected] == [RejectReason.NO_CAPACITY]
    c.submit("later", text("later"), greedy(5), deadline_ms=50)  # the request's own deadline
    later = c.collect(["later"], timeout_s=5)["later"]
    assert [r.reason for r in later.rejected] == [RejectReason.NO_CAPACITY]
    assert c.outcome("hog").finish is None
    c.abort(["hog"])
    c.wait_stats(lambda s: s.active_sequences == 0 and s.queue_depth == 0)


# ---- aborts and vanished frontends -----------------------------------------------------------


def test_abort_frees_every_block_before_the_next_step(abort_core: SpawnedCore) -> None:
    c = client_of(abort_core)
    rids = [f"a{i}" for i in range(6)]
    for i, rid in enumerate(rids):
        c.submit(rid, random_prompt(30 + i, 10 + 5 * i), greedy(400, ignore_eos=True))
    for rid in rids:
        c.wait_tokens(rid, 2)
    busy = c.stats()
    assert busy.active_sequences == 6
    assert busy.kv_blocks_used > 0
    c.abort(rids)
    s = c.stats()  # handled after the Abort, which the core applies before its next step
    assert (s.kv_blocks_used, s.active_sequences, s.queue_depth) == (0, 0, 0)
    counts = [len(c.outcome(r).token_ids) for r in rids]
    c.listen(0.2)
    assert [len(c.outcome(r).token_ids) for r in rids] == counts
    assert all(c.outcome(r).finish is None for r in rids)


def test_a_silent_frontend_has_its_requests_aborted(abort_core: SpawnedCore) -> None:
    silent = abort_core.client(identity=b"silent-frontend", heartbeat=False)
    silent.hello()
    for i in range(3):
        silent.submit(f"s{i}", random_prompt(50 + i, 8), greedy(500, ignore_eos=True))
    silent.wait_tokens("s2", 1)
    watcher = client_of(abort_core)
    assert watcher.stats().active_sequences == 3
    watcher.wait_stats(
        lambda s: (s.active_sequences, s.kv_blocks_used, s.queue_depth) == (0, 0, 0),
        timeout_s=10,
        what="the silent frontend's requests are aborted",
    )
    assert all(len(silent.outcome(f"s{i}").token_ids) < 500 for i in range(3))


def test_bye_aborts_everything_the_frontend_owns(abort_core: SpawnedCore) -> None:
    leaving = client_of(abort_core)
    for i in range(3):
        leaving.submit(f"bye{i}", random_prompt(60 + i, 8), greedy(500, ignore_eos=True))
    leaving.wait_tokens("bye2", 1)
    leaving.send(Bye())
    s = leaving.stats()  # after the Bye: ordered on this socket
    assert (s.active_sequences, s.kv_blocks_used, s.queue_depth) == (0, 0, 0)


def test_a_duplicate_rid_is_refused_while_the_first_carries_on(abort_core: SpawnedCore) -> None:
    c = client_of(abort_core)
    c.submit("dup", text("duplicate"), greedy(300, ignore_eos=True))
    first = c.wait_tokens("dup", 1)
    c.send(Submit("dup", text("other"), greedy(5)))
    c.wait_until(lambda: bool(first.rejected), 10, "the duplicate is refused")
    assert [r.reason for r in first.rejected] == [RejectReason.INVALID]
    n = len(first.token_ids)
    c.wait_tokens("dup", n + 3)
    assert first.finish is None
    c.abort(["dup"])
    assert c.stats().active_sequences == 0


# ---- drain -------------------------------------------------------------------------------------


def test_sigterm_drains(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> None:
    core = start(tmp_path_factory, tiny, "drain", step_delay_ms=20)
    try:
        c = client_of(core)
        for rid in ("d1", "d2"):
            c.submit(rid, text(rid), greedy(40, ignore_eos=True))
        c.submit("keeper", text("keeper"), greedy(2000, ignore_eos=True))  # outlives the test
        for rid in ("d1", "d2", "keeper"):
            c.wait_tokens(rid, 1)  # admitted: a Submit still unread at SIGTERM is refused
        core.terminate()
        c.listen(0.2)
        c.submit("after-term", text("late"), greedy(5))
        outs = c.collect(["d1", "d2", "after-term"])
        assert [r.reason for r in outs["after-term"].rejected] == [RejectReason.SHUTTING_DOWN]
        for rid in ("d1", "d2"):
            assert outs[rid].finish == FinishReason.LENGTH
            assert len(outs[rid].token_ids) == 40
        keeper = c.wait_tokens("keeper", len(c.outcome("keeper").token_ids) + 5)
        assert keeper.finish is None  # still running after SIGTERM
        assert core.proc is not None
        assert core.proc.poll() is None  # draining, not gone
        c.abort(["keeper"])
        c.wait_until(lambda: c.shutdown is not None, 10, "Shutdown")
        assert c.shutdown is not None
        assert not c.shutdown.fatal
        assert core.wait() == 0
    finally:
        core.stop()

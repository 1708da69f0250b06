"""Scheduler: budgets, chunked prefill, priorities, queue, deadlines and speculation, driven by
a fake model over a fake paged KV cache (see scheduler_harness.py); preemption and aborts are
in test_scheduler_preemption.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from enginecore.request import RequestStatus
from enginecore.spec import NgramProposer
from tests.fixtures.scheduler_harness import Harness, config, hashed, mostly_periodic, prompt

# ---- budgets -------------------------------------------------------------------------------


@pytest.mark.parametrize("prefill_chunk", [0, 3, 8])
@pytest.mark.parametrize(("budget", "max_seqs"), [(4, 1), (16, 3), (64, 16), (5, 2)])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_outputs_equal_reference_within_budgets(
    prefill_chunk: int, budget: int, max_seqs: int, prefix_cache: bool
) -> None:
    cfg = config(max_num_batched_tokens=budget, max_num_seqs=max_seqs, prefill_chunk=prefill_chunk)
    h = Harness(cfg, prefix_cache=prefix_cache)
    shared = prompt(99, 13)
    for i in range(10):
        p = shared + prompt(i, i) if i % 3 == 0 else prompt(i, 1 + 3 * i)
        h.add(f"r{i}", p, max_tokens=1 + (i * 5) % 11)
    h.run()
    h.assert_outputs()


def test_budget_splits_the_second_prompt_and_queues_the_third() -> None:
    h = Harness(config(max_num_batched_tokens=12))
    for rid in "abc":
        h.add(rid, prompt(ord(rid), 10), max_tokens=4)
    s = h.step()
    assert s is not None
    assert [(r.rid, len(c.token_ids)) for r, c, _ in s.seqs] == [
        ("a", 10),
        ("b", 2),
    ]
    assert [c.num_sample for _, c, _ in s.seqs] == [1, 0]  # b is mid-prompt: nothing to sample
    assert list(h.sched.waiting) == ["c"]
    s = h.step()  # a decodes first, then b's rest (8), then c gets the last 3 of the budget
    assert s is not None
    assert [(r.rid, len(c.token_ids)) for r, c, _ in s.seqs] == [
        ("a", 1),
        ("b", 8),
        ("c", 3),
    ]
    h.run()
    h.assert_outputs()


def test_max_num_seqs_caps_running_requests() -> None:
    h = Harness(config(max_num_seqs=2))
    for i in range(5):
        h.add(f"r{i}", prompt(i, 5), max_tokens=3 + i)
    while h.sched.has_work():
        s = h.step()
        assert s is not None
        assert len(s.seqs) <= 2
    assert h.admitted == ["r0", "r1", "r2", "r3", "r4"]
    h.assert_outputs()


@pytest.mark.parametrize(("prefill_chunk", "chunk_len"), [(4, 4), (0, 6)])
def test_a_long_prompt_never_stalls_running_decodes(prefill_chunk: int, chunk_len: int) -> None:
    h = Harness(config(max_num_batched_tokens=8, prefill_chunk=prefill_chunk))
    h.add("a", prompt(1, 3), max_tokens=40)
    h.add("b", prompt(2, 4), max_tokens=40)
    h.step()
    long = h.add("long", prompt(3, 40), max_tokens=2)
    steps = 0
    while long.is_prefilling or long.status == RequestStatus.WAITING:
        s = h.step()
        assert s is not None
        steps += 1
        sizes = {r.rid: len(c.token_ids) for r, c, _ in s.seqs}
        assert sizes["a"] == 1
        assert sizes["b"] == 1
        assert sizes["long"] <= chunk_len
    assert steps == -(-40 // chunk_len) - (1 if 40 % chunk_len == 1 else 0)
    h.run()
    h.assert_outputs()


# ---- priority, queue, deadlines --------------------------------------------------------------


def test_waiting_requests_run_by_priority_then_arrival() -> None:
    h = Harness(config(max_num_seqs=1))
    for rid, priority in [("a", 0), ("b", 10), ("c", -5), ("d", 10), ("e", 0)]:
        h.add(rid, prompt(ord(rid), 3), max_tokens=2, priority=priority)
    h.run()
    assert h.admitted == ["b", "d", "a", "e", "c"]
    h.assert_outputs()


def test_queue_capacity_counts_admitted_requests_not_yet_running() -> None:
    h = Harness(config(queue_capacity=2, max_num_seqs=1))
    h.add("a", prompt(1, 3), max_tokens=5)
    assert not h.sched.queue_full()
    h.add("b", prompt(2, 3), max_tokens=5)
    assert h.sched.queue_full()
    h.step()  # a runs, b still waits
    assert not h.sched.queue_full()
    h.add("c", prompt(3, 3), max_tokens=5)
    assert h.sched.queue_full()
    assert h.sched.queue_depth == 2


def test_preempted_requests_do_not_count_against_the_queue() -> None:
    h = Harness(config(queue_capacity=1), num_blocks=4)
    h.add("old", prompt(1, 4), max_tokens=8)
    h.add("new", prompt(2, 4), max_tokens=8)
    while not h.victims:
        h.step()
    assert h.victims == ["new"]
    assert list(h.sched.waiting) == ["new"]
    assert h.sched.queue_depth == 1
    assert not h.sched.queue_full()
    h.run()
    h.assert_outputs()


def test_expire_drops_only_requests_that_never_started() -> None:
    h = Harness(config(max_num_seqs=1), num_blocks=4)
    a = h.add("a", prompt(1, 4), max_tokens=8, deadline=10.0)
    h.add("b", prompt(2, 4), max_tokens=8, deadline=10.0)
    h.add("forever", prompt(3, 4), max_tokens=2, deadline=None)
    h.step()
    assert a.status == RequestStatus.RUNNING
    assert h.sched.expire(9.0) == []
    late = h.sched.expire(10.5)
    assert [r.rid for r in late] == ["b"]
    assert list(h.sched.waiting) == ["forever"]
    h.check_blocks()
    h.run()
    h.assert_outputs(["a", "forever"])


def test_a_preempted_request_never_expires() -> None:
    h = Harness(config(), num_blocks=4)
    h.add("old", prompt(1, 4), max_tokens=8)
    new = h.add("new", prompt(2, 4), max_tokens=8, deadline=5.0)
    while not h.victims:
        h.step()
    assert new.status == RequestStatus.PREEMPTED
    assert h.sched.expire(1e9) == []
    h.run()
    h.assert_outputs()


# ---- speculation -------------------------------------------------------------------------


@pytest.mark.parametrize("num_blocks", [64, 12])
def test_prompt_lookup_drafts_give_the_same_outputs(num_blocks: int) -> None:
    runs = {}
    for spec in (False, True):
        h = Harness(
            config(max_num_batched_tokens=16, prefill_chunk=4),
            num_blocks=num_blocks,
            proposer=NgramProposer(3, 1, 4) if spec else None,
            f=mostly_periodic,
        )
        for i in range(4):
            h.add(f"r{i}", [*range(10), *range(i)], max_tokens=20, stop=frozenset({99}))
        runs[spec] = h.run()
        h.assert_outputs()
        if spec:
            assert h.accepted > 0
            assert h.rejected > 0
    assert runs[True] < runs[False]


def test_drafts_never_pass_max_tokens() -> None:
    h = Harness(config(), proposer=NgramProposer(2, 1, 8), f=mostly_periodic)
    req = h.add("r", list(range(10)), max_tokens=3)
    h.run()
    assert len(req.output_ids) == 3
    h.assert_outputs()


def counting(ctx: Sequence[int]) -> int:
    return (ctx[-1] + 1) % 10  # prompt lookup always guesses right: every draft is accepted


def test_drafts_never_crowd_a_decode_out_of_the_step() -> None:
    """8 counting decodes that keep asking for more drafts, on a 16-token budget: every decode
    runs every step, and drafts only fill what is left."""
    h = Harness(config(max_num_batched_tokens=16), proposer=NgramProposer(2, 1, 16), f=counting)
    reqs = [h.add(f"r{i}", [*range(10), *range(10)], max_tokens=60) for i in range(8)]
    while any(r.is_prefilling or r.status == RequestStatus.WAITING for r in reqs):
        h.step()
    for _ in range(6):
        scheduled = h.step()
        assert scheduled is not None
        assert sorted(s.req.rid for s in scheduled.seqs) == sorted(r.rid for r in reqs)
        assert scheduled.batch.num_tokens == 16  # the 8 spare tokens went to drafts
    h.run()
    h.assert_outputs()


# ---- everything at once ----------------------------------------------------------------------

workload = st.lists(
    st.tuples(
        st.integers(1, 14),  # prompt length
        st.integers(4, 12),  # max_tokens
        st.integers(-2, 2),  # priority
        st.integers(0, 3),  # prompt family (shared prefixes)
        st.integers(0, 40),  # abort after this many steps (never if >= 12)
        st.integers(0, 4),  # arrive after this many steps
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=workload,
    budget=st.integers(1, 24),
    max_seqs=st.integers(1, 6),
    prefill_chunk=st.sampled_from([0, 1, 3, 8]),
    num_blocks=st.integers(7, 12),
    prefix_cache=st.booleans(),
    spec=st.booleans(),
)
def test_random_workloads_keep_every_invariant(
    jobs: list[tuple[int, int, int, int, int, int]],
    budget: int,
    max_seqs: int,
    prefill_chunk: int,
    num_blocks: int,
    prefix_cache: bool,
    spec: bool,
) -> None:
    cfg = config(max_num_batched_tokens=budget, max_num_seqs=max_seqs, prefill_chunk=prefill_chunk)
    proposer = NgramProposer(3, 1, 3) if spec else None
    h = Harness(cfg, num_blocks, prefix_cache, proposer, mostly_periodic if spec else hashed)
    stop = frozenset() if spec else frozenset({0})
    # shared prefixes; periodic ones when speculating, so drafts match
    families = [[(k + j) % 10 for j in range(14)] if spec else prompt(k, 14) for k in range(4)]
    aborted = set()
    step = 0
    while step < 6 or h.sched.has_work():
        for i, (n, max_tokens, priority, family, abort_at, arrive_at) in enumerate(jobs):
            rid = f"r{i}"
            if arrive_at == step:
                h.add(rid, families[family][:n], max_tokens, priority, stop=stop)
            if rid in h.requests and abort_at + arrive_at == step and abort_at < 12:
                if h.sched.abort(rid) is not None:
                    aborted.add(rid)
                h.check_blocks()
        h.step()
        step += 1
        assert step < 3000, "the scheduler stopped making progress"
    assert h.blocks.num_used == 0
    h.assert_outputs([rid for rid in h.requests if rid not in aborted])
    event(f"preempted: {h.sched.preemptions_total > 0}")
    event(f"aborted: {bool(aborted)}")
    event(f"drafts accepted: {h.accepted > 0}")

"""Scheduler: preemption by recompute and aborts in every state, driven by a fake model over a
fake paged KV cache (see scheduler_harness.py)."""

from __future__ import annotations

import pytest

from enginecore.request import RequestStatus
from tests.fixtures.scheduler_harness import Harness, config, prompt

# ---- preemption --------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_preemption_recomputes_and_outputs_are_unchanged(prefix_cache: bool) -> None:
    h = Harness(config(prefill_chunk=4), num_blocks=10, prefix_cache=prefix_cache)
    for i in range(4):
        h.add(f"r{i}", prompt(i, 8), max_tokens=24)  # 8 blocks each, 32 wanted, 10 in the pool
    h.run()
    assert h.sched.preemptions_total == len(h.victims) > 0
    assert sum(r.num_preemptions for r in h.requests.values()) == h.sched.preemptions_total
    assert h.requests["r0"].num_preemptions == 0  # the oldest always makes progress
    h.assert_outputs()


@pytest.mark.parametrize(
    ("jobs", "victim"),
    [
        ({"a": (0, 4), "b": (0, 6), "c": (0, 6)}, "c"),  # equal priority: the newest
        ({"a": (0, 6), "b": (5, 4), "c": (1, 6)}, "a"),  # the lowest priority, though the oldest
        ({"a": (3, 4), "b": (1, 6), "c": (1, 6)}, "c"),  # the newest of the lowest
    ],
)
def test_preemption_picks_lowest_priority_then_newest(
    jobs: dict[str, tuple[int, int]], victim: str
) -> None:
    """rid -> (priority, prompt length); the 4-token prompt needs a block first, in a full pool."""
    h = Harness(config(), num_blocks=5)
    for i, (rid, (priority, n)) in enumerate(jobs.items()):
        h.add(rid, prompt(i, n), max_tokens=4, priority=priority)
    h.step()  # prefills: 1 + 2 + 2 blocks, the pool is full
    assert (h.blocks.num_free, h.blocks.num_cached, h.victims) == (0, 0, [])
    h.step()
    assert h.victims == [victim]
    h.run()
    h.assert_outputs()


def test_preempted_request_keeps_its_first_cached_count() -> None:
    h = Harness(config(), num_blocks=8)
    shared = prompt(7, 8)
    h.add("warm", shared + [1], max_tokens=1)
    h.run()
    h.add("a", prompt(1, 4), max_tokens=20)
    b = h.add("b", [*shared, 2], max_tokens=20)
    h.run()
    assert b.num_preemptions > 0
    assert b.num_cached_tokens == 8
    h.assert_outputs()


# ---- aborts ------------------------------------------------------------------------------


def test_abort_frees_blocks_in_every_state() -> None:
    h = Harness(config(prefill_chunk=4, max_num_batched_tokens=8, max_num_seqs=3), num_blocks=16)
    h.add("decoding", prompt(1, 3), max_tokens=30)
    h.add("prefilling", prompt(2, 30), max_tokens=4)
    h.add("other", prompt(3, 5), max_tokens=10)
    h.add("keep", prompt(4, 3), max_tokens=6)
    h.add("waiting", prompt(5, 3), max_tokens=6)
    for _ in range(3):
        h.step()
    states = {r.rid: r.status for r in h.requests.values()}
    assert states["decoding"] == states["prefilling"] == RequestStatus.RUNNING
    assert h.requests["prefilling"].is_prefilling
    assert states["waiting"] == RequestStatus.WAITING
    used = h.blocks.num_used
    for rid in ("decoding", "prefilling", "waiting"):
        req = h.sched.abort(rid)
        assert req is not None
        assert req.status == RequestStatus.FINISHED_ABORTED
        assert not h.blocks.has(rid) and rid not in h.sched.requests
        h.check_blocks()
    assert h.blocks.num_used < used
    assert h.sched.abort("decoding") is None
    assert h.sched.abort("unknown") is None
    h.run()
    h.assert_outputs(["other", "keep"])
    assert h.blocks.num_free + h.blocks.num_cached == h.blocks.num_blocks

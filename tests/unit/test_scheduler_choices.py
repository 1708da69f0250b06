"""Scheduler: the choices of one request (n > 1) prefill once and fork its KV; prompt scoring
(prompt logprobs) computes every prompt row; cache salts keep prefixes apart. Driven by the
fake model over a fake paged KV cache (scheduler_harness.py), which checks every context it
reads back through a block table."""

from __future__ import annotations

import pytest

from enginecore.request import RequestStatus, choice_rid
from tests.fixtures.scheduler_harness import BS, Harness, config, hashed, prompt

# ---- choices -------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [BS * 3, BS * 3 + 1, BS * 3 - 1, 2])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_eight_choices_prefill_once(length: int, prefix_cache: bool) -> None:
    h = Harness(config(max_num_seqs=8), prefix_cache=prefix_cache)
    h.add("r", prompt(1, length), max_tokens=6, n=8)
    h.step()
    assert h.sched.prefill_tokens_total == length
    # the prompt's step sampled every choice's first token: all run now, each on its own fork
    assert len(h.sched.running) == 8
    assert not h.sched.waiting
    h.run()
    assert h.sched.prefill_tokens_total == length
    h.assert_outputs()  # every choice read its prompt back from its own table
    firsts = [e for e in h.events if e.token_ids and e.rid == "r"]
    assert sorted({e.index for e in firsts}) == list(range(8))


def test_forks_share_full_prompt_blocks_and_copy_the_partial_one() -> None:
    h = Harness(config(max_num_seqs=4))
    leader = h.add("r", prompt(2, BS * 2 + 1), max_tokens=4, n=3)
    h.step()
    tables = [h.blocks.table(choice_rid("r", i)) for i in range(3)]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]  # the two full blocks, shared
    assert len({t[2] for t in tables}) == 3  # the partial one: a copy each
    assert leader.status == RequestStatus.RUNNING
    h.run()
    h.assert_outputs()


def test_choices_wait_for_the_prompt_of_choice_0() -> None:
    h = Harness(config(max_num_batched_tokens=4, prefill_chunk=4, max_num_seqs=8))
    h.add("r", prompt(3, 14), max_tokens=3, n=3)
    for _ in range(3):  # 4 + 4 + 4 of 14 tokens: the other choices are never scheduled
        s = h.step()
        assert s is not None
        assert [seq.req.rid for seq in s.seqs] == ["r"]
        assert not s.riders
    s = h.step()  # the last 2 prompt tokens: both others ride the last row
    assert s is not None
    assert [rider.rid for _, rider in s.riders] == ["r#1", "r#2"]
    h.run()
    assert h.sched.prefill_tokens_total == 14
    h.assert_outputs()


def test_choices_without_a_free_slot_take_the_prefix_cache_later() -> None:
    h = Harness(config(max_num_seqs=2))
    h.add("r", prompt(4, BS * 4 + 2), max_tokens=5, n=4)
    s = h.step()
    assert s is not None
    assert len(s.riders) == 1  # one slot left beside choice 0
    h.run()
    h.assert_outputs()
    # the two late choices found the full blocks cached, and the partial one too: choice 0
    # published it once its output filled it (a partial hit: all but the last prompt token)
    assert h.sched.prefill_tokens_total == BS * 4 + 2 + 2 * 1


def test_a_fork_the_pool_cannot_hold_waits_as_if_preempted() -> None:
    # 8 blocks of 4: a running request holds 4, choice 0 takes 3 (9 prompt tokens), and each
    # fork needs a block of its own for the partial one: the second finds none
    h = Harness(config(max_num_seqs=4), num_blocks=8)
    h.add("hog", prompt(5, 14), max_tokens=6)
    h.step()
    h.add("r", prompt(6, 9), max_tokens=3, n=3)
    s = h.step()
    assert s is not None and len(s.riders) == 2
    assert h.requests["r#1"].status == RequestStatus.RUNNING
    late = h.requests["r#2"]
    assert late.status == RequestStatus.PREEMPTED and len(late.output_ids) == 1
    h.run()
    h.assert_outputs()


def test_aborting_choice_0_leaves_the_others_admissible() -> None:
    h = Harness(config(max_num_seqs=8, max_num_batched_tokens=4, prefill_chunk=4))
    h.add("r", prompt(7, 10), max_tokens=3, n=2)
    h.step()
    h.sched.abort("r")
    h.run()
    h.assert_outputs(["r#1"])


# ---- prompt scoring ------------------------------------------------------------------------


@pytest.mark.parametrize("prefill_chunk", [0, 3, 5])
def test_a_scored_prompt_keeps_every_row_and_skips_the_cache(prefill_chunk: int) -> None:
    h = Harness(config(prefill_chunk=prefill_chunk))
    p = prompt(8, 13)
    h.add("warm", p, max_tokens=2)
    h.run()
    before = h.sched.prefill_tokens_total
    scored = h.add("scored", p, max_tokens=2, prompt_logprobs=1)
    h.run()
    assert h.sched.prefill_tokens_total - before == len(p)  # nothing taken from the cache
    assert scored.num_cached_tokens == 0
    [first, *_] = [e for e in h.events if e.rid == "scored"]
    assert first.prompt_logprobs is not None
    # row p scores prompt token p + 1; the fake model's "logprob" is its prediction there
    assert [lp.token_id for lp in first.prompt_logprobs] == p[1:]
    assert [lp.logprob for lp in first.prompt_logprobs] == [hashed(p[: i + 1]) for i in range(12)]
    h.assert_outputs()


def test_max_tokens_0_scores_the_prompt_and_generates_nothing() -> None:
    h = Harness(config(prefill_chunk=4))
    p = prompt(9, 10)
    req = h.add("score", p, max_tokens=0, prompt_logprobs=0)
    h.run()
    [event] = [e for e in h.events if e.rid == "score"]
    assert (event.token_ids, event.finish) == ([], "length")
    assert event.prompt_logprobs is not None and len(event.prompt_logprobs) == 9
    assert req.status == RequestStatus.FINISHED_LENGTH and not req.output_ids


# ---- cache salts ---------------------------------------------------------------------------


def test_a_cache_salt_shares_prefixes_only_within_itself() -> None:
    h = Harness(config())
    p = prompt(10, 3 * BS + 1)
    for rid, salt in (("a", ""), ("b", "tenant-1"), ("c", "tenant-1"), ("d", "tenant-2")):
        h.add(rid, p, max_tokens=1).cache_salt = salt
        h.run()
    cached = {rid: h.requests[rid].num_cached_tokens for rid in "abcd"}
    assert cached == {"a": 0, "b": 0, "c": 3 * BS, "d": 0}

"""Engine steps driven in-process (tests/fixtures/engine_harness.py) on tiny models.

The succ model makes outputs obvious (byte i is followed by byte i + 1), so speculation,
stops and limits can be checked token by token.
"""

from __future__ import annotations

import pytest

from shared.protocol import Abort, FinishReason, RejectReason, SamplingParams, Submit
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import COUNTING, greedy, make_core, tokens_of


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

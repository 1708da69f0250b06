"""The engine on tiny models (tests/fixtures/engine_harness.py): n choices prefill once and
repeat when seeded, prompt logprobs equal a direct forward, one choice can be stopped, cache
salts, and the admission acknowledgement and retry hints."""

from __future__ import annotations

import numpy as np
import pytest

from shared.protocol import (
    Abort,
    Accepted,
    FinishReason,
    Rejected,
    RejectReason,
    SamplingParams,
    Submit,
    TokenEvent,
)
from tests.conftest import TinyModels
from tests.fixtures import reference
from tests.fixtures.engine_harness import Core, greedy, make_core

PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, 256, 23)]
SEEDED = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)


def choices(core: Core, rid: str) -> dict[int, list[int]]:
    """Each choice's tokens, by index."""
    out: dict[int, list[int]] = {}
    for ev in core.events():
        if ev.rid == rid:
            out.setdefault(ev.index, []).extend(ev.token_ids)
    return out


def first_events(core: Core, rid: str) -> dict[int, TokenEvent]:
    out: dict[int, TokenEvent] = {}
    for ev in core.events():
        if ev.rid == rid:
            out.setdefault(ev.index, ev)
    return out


def run(core: Core, *submits: Submit) -> None:
    for submit in submits:
        core.send(submit)
    core.run_until_idle()


def test_eight_choices_cost_one_prefill(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch, max_num_seqs=8, num_blocks=128)
    run(core, Submit("r", PROMPT, SEEDED, n=8))
    assert core.stats().prefill_tokens_total == len(PROMPT)
    got = choices(core, "r")
    assert sorted(got) == list(range(8)) and all(len(t) == 12 for t in got.values())
    assert core.stats().kv_blocks_used == 0
    # without the shared prefill, the same request computes its prompt eight times
    alone = make_core(tiny.gguf_quant, monkeypatch, max_num_seqs=8, num_blocks=128)
    run(alone, *(Submit(f"r{i}", PROMPT, SEEDED, cache_salt=str(i)) for i in range(8)))
    assert alone.stats().prefill_tokens_total == 8 * len(PROMPT)


def test_seeded_choices_repeat_and_differ(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = []
    for busy in (False, True):
        core = make_core(tiny.gguf_quant, monkeypatch)
        if busy:  # other work in the batches changes nothing
            core.send(Submit("other", PROMPT[:5], SamplingParams(max_tokens=20, temperature=1.0)))
        run(core, Submit("r", PROMPT, SEEDED, n=4))
        runs.append(choices(core, "r"))
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0].values()}) == 4
    # choice i samples as a request of its own seeded with seed + i would
    core = make_core(tiny.gguf_quant, monkeypatch)
    seed_2 = SamplingParams(max_tokens=12, temperature=1.0, seed=9, ignore_eos=True)
    run(core, Submit("two", PROMPT, seed_2))
    assert choices(core, "two")[0] == runs[0][2]


def test_prompt_logprobs_equal_a_direct_forward(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.gguf_f32, monkeypatch)
    run(core, Submit("warm", PROMPT, greedy(2)))  # the prompt is cached: it must not be used
    run(core, Submit("score", PROMPT, greedy(1, prompt_logprobs=3, logprobs=0)))
    [first] = first_events(core, "score").values()
    assert first.num_cached_tokens == 0
    assert first.prompt_logprobs is not None
    cfg, state = reference.state_from_gguf(tiny.gguf_f32)
    logits, _ = reference.forward(cfg, state, PROMPT)
    want = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    want -= logits.max(-1, keepdims=True)
    assert [lp.token_id for lp in first.prompt_logprobs] == PROMPT[1:]
    got = [lp.logprob for lp in first.prompt_logprobs]
    np.testing.assert_allclose(got, [want[p, t] for p, t in enumerate(PROMPT[1:])], atol=1e-4)
    for p, lp in enumerate(first.prompt_logprobs):
        assert [t.token_id for t in lp.top] == list(np.argsort(-want[p], kind="stable")[:3])
        assert lp.rank == 1 + int((want[p] > want[p, lp.token_id]).sum())


def test_max_tokens_0_only_scores(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch)
    run(core, Submit("score", PROMPT, greedy(0, prompt_logprobs=0)))
    [event] = [ev for ev in core.events() if ev.rid == "score"]
    assert (event.token_ids, event.finish) == ([], FinishReason.LENGTH)
    assert event.prompt_logprobs is not None and len(event.prompt_logprobs) == len(PROMPT) - 1


def test_one_choice_can_be_stopped(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch)
    core.send(Submit("r", PROMPT, SEEDED, n=3))
    for _ in range(3):
        core.tick()
    core.send(Abort(["r"], index=1))
    core.run_until_idle()
    got = choices(core, "r")
    assert len(got[1]) < 12 and len(got[0]) == len(got[2]) == 12
    assert core.stats().kv_blocks_used == 0


def test_a_cache_salt_keeps_prefixes_apart(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch)
    for rid, salt in (("a", "x"), ("b", "y"), ("c", "x"), ("d", "")):
        run(core, Submit(rid, PROMPT, greedy(2), cache_salt=salt))
    cached = {
        rid: ev.num_cached_tokens for rid, ev in ((r, first_events(core, r)[0]) for r in "abcd")
    }
    # c: all but the last of 23 prompt tokens, a's 5 whole blocks of 4 and 2 slots of the sixth
    assert cached == {"a": 0, "b": 0, "c": 22, "d": 0}


def test_min_tokens_and_logit_bias(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tiny.succ, monkeypatch)  # after byte b comes byte b + 1
    c = ord("c")
    run(core, Submit("plain", [ord("a")], greedy(8, stop_token_ids=(c,))))
    run(core, Submit("min", [ord("a")], greedy(8, stop_token_ids=(c,), min_tokens=4)))
    assert choices(core, "plain")[0] == [ord("b"), c]
    held = choices(core, "min")[0]
    assert len(held) >= 4 and c not in held[:4]
    core = make_core(tiny.gguf_quant, monkeypatch)
    run(core, Submit("free", PROMPT, greedy(3)))
    run(core, Submit("bias", PROMPT, greedy(3, logit_bias={65: 100.0})))
    assert choices(core, "free")[0] != [65] * 3
    assert choices(core, "bias")[0] == [65] * 3


def test_admission_is_acknowledged_and_refusals_say_when_to_retry(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.gguf_quant, monkeypatch)
    core.send(Submit("ok", PROMPT, greedy(2)))
    core.send(Submit("busy", PROMPT, greedy(2), n=15))  # the queue holds 16
    core.send(Submit("too_many", PROMPT, greedy(2), n=2))
    core.send(Submit("never", PROMPT, greedy(2), n=17))  # could never be queued
    core.tick()
    sent = [m for _, m in core.channel.sent if isinstance(m, Accepted | Rejected)]
    assert [type(m) for m in sent] == [Accepted, Accepted, Rejected, Rejected]
    assert sent[:2] == [Accepted("ok"), Accepted("busy")]
    refusal, never = sent[2:]
    assert isinstance(refusal, Rejected) and refusal.reason is RejectReason.QUEUE_FULL
    assert 1 <= refusal.retry_after_s <= 60
    assert isinstance(never, Rejected) and never.reason is RejectReason.INVALID
    core.engine.drain()  # as a ShutdownCore with the spawner's token does
    core.send(Submit("late", PROMPT, greedy(2)))
    core.tick()
    [late] = [r for r in core.rejected() if r.rid == "late"]
    assert (late.reason, late.retry_after_s) == (RejectReason.SHUTTING_DOWN, 1)

"""Fault isolation inside the core, in-process: a failure is its request's, never the loop's.

Faults are injected by wrapping the real runner, sampler and submit path of an in-process
engine on the succ model (byte i is followed by byte i + 1, so every output is obvious).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from enginecore.batch import Batch
from enginecore.sampler import Sampler, SampleSeq
from shared.protocol import Embed, FinishReason, RejectReason, Submit
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import COUNTING, Core, greedy, make_core, tokens_of

POISON = 7  # a prompt holding this token id triggers the injected fault


def poisoned_forward(core: Core) -> None:
    """The forward pass raises on any batch with a poisoned token."""
    run = core.engine.runner.run

    def faulty(batch: Batch, return_hidden: bool = False) -> Any:
        if POISON in batch.token_ids.tolist():
            raise RuntimeError("injected forward fault")
        return run(batch, return_hidden)

    core.engine.runner.run = faulty  # type: ignore[method-assign]


def finishes(core: Core) -> dict[str, FinishReason]:
    return {ev.rid: ev.finish for ev in core.events() if ev.finish is not None}


def test_a_failed_forward_fails_that_steps_requests_and_the_loop_goes_on(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    poisoned_forward(core)
    core.send(Submit("ok", COUNTING, greedy(6)))
    core.tick()  # "ok" is prefilled alone
    core.send(Submit("bad", [POISON, 8, 9], greedy(6)))
    core.tick()  # "ok" decodes beside the poisoned prefill: both fail
    core.send(Submit("after", COUNTING, greedy(6)))
    core.run_until_idle()
    assert finishes(core) == {
        "ok": FinishReason.ERROR,
        "bad": FinishReason.ERROR,
        "after": FinishReason.LENGTH,
    }
    assert tokens_of(core.events(), "after") == [14, 15, 16, 17, 18, 19]
    assert core.stats().kv_blocks_used == 0 and not core.engine.requests
    assert core.engine.failed_steps == 0  # reset by the good steps after the failure


def test_a_sampling_failure_fails_only_its_request(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    emit_one: Callable[..., Any] = Sampler._emit_one

    def faulty(self: Sampler, rows: Any, best: list[int], seq: SampleSeq) -> Any:
        if POISON in seq.row.prompt_ids:
            raise FloatingPointError("injected sampling fault")
        return emit_one(self, rows, best, seq)

    monkeypatch.setattr(Sampler, "_emit_one", faulty)
    core.send(Submit("ok", COUNTING, greedy(6)))
    core.send(Submit("bad", [POISON, 8, 9], greedy(6)))
    core.run_until_idle()
    assert finishes(core) == {"ok": FinishReason.LENGTH, "bad": FinishReason.ERROR}
    assert tokens_of(core.events(), "ok") == [14, 15, 16, 17, 18, 19]
    assert tokens_of(core.events(), "bad") == []
    assert core.stats().kv_blocks_used == 0 and not core.engine.requests


def test_a_message_that_fails_in_the_core_is_refused_as_internal(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    submit = core.engine.submit

    def faulty(client: bytes, msg: Submit) -> None:
        submit(client, msg)  # admitted, then the core fails: nothing of it may remain
        if POISON in msg.prompt_ids:
            raise RuntimeError("injected submit fault")

    core.engine.submit = faulty  # type: ignore[method-assign]

    add = core.engine.embedder.add

    def faulty_add(rid: str, client: bytes, inputs: list[list[int]]) -> Any:
        add(rid, client, inputs)  # queued, then the core fails: nothing of it may remain
        raise RuntimeError("injected embedding fault")

    core.engine.embedder.add = faulty_add  # type: ignore[method-assign]
    core.send(Submit("bad", [POISON, 8, 9], greedy(6)))
    core.send(Embed("emb", [[1, 2, 3]]))
    core.send(Submit("ok", COUNTING, greedy(3)))
    core.run_until_idle()
    assert {r.rid: r.reason for r in core.rejected()} == {
        "bad": RejectReason.INTERNAL,
        "emb": RejectReason.INTERNAL,
    }
    assert finishes(core) == {"ok": FinishReason.LENGTH}
    assert core.stats().kv_blocks_used == 0 and not core.engine.requests
    assert not core.engine.embedder.jobs

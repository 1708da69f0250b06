"""Embeddings inside the step budget, in-process: chunked like prefill, decodes never wait.

The harness engine has a 32-token budget and 8-token prefill chunks (tests/fixtures)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from enginecore.batch import SeqChunk
from shared.protocol import Abort, Embed, Embedded, FinishReason, RejectReason, Submit
from tests.conftest import TinyModels
from tests.fixtures.engine_harness import COUNTING, Core, greedy, make_core, tokens_of

PREFILL_CHUNK = 8
LONG = [(7 * i) % 250 for i in range(100)]  # 100 tokens: 13 chunks of at most 8


def embedded(core: Core) -> dict[str, Embedded]:
    return {m.rid: m for _, m in core.channel.sent if isinstance(m, Embedded)}


def record_embedding_calls(core: Core) -> list[int]:
    """Tokens of each embedding forward call, as they happen."""
    calls: list[int] = []
    hidden_states = core.engine.runner.hidden_states

    def recorded(chunks: list[SeqChunk]) -> Any:
        calls.append(sum(len(c.token_ids) for c in chunks))
        return hidden_states(chunks)

    core.engine.runner.hidden_states = recorded  # type: ignore[method-assign]
    return calls


def whole(core: Core, ids: list[int]) -> np.ndarray:
    """The embedding of `ids` computed in one forward call, as before chunking."""
    blocks, runner = core.engine.blocks, core.engine.runner
    table = blocks.allocate_scratch("whole", len(ids))
    assert table is not None
    try:
        hidden = runner.hidden_states([SeqChunk(ids, 0, table, len(ids))])
    finally:
        blocks.free("whole", [])
    mean = hidden.astype(np.float64).mean(axis=0)
    return np.asarray(mean / np.linalg.norm(mean))


def test_a_long_input_runs_in_prefill_sized_chunks_beside_every_decode(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    calls = record_embedding_calls(core)
    core.send(Submit("gen", COUNTING, greedy(40)))
    core.tick()
    core.tick()
    core.tick()  # its prompt (24 tokens) is in: it decodes from here on
    decoded = len(tokens_of(core.events(), "gen"))
    core.send(Embed("emb", [LONG]))
    steps = 0
    while "emb" not in embedded(core):
        core.tick()
        steps += 1
        assert len(tokens_of(core.events(), "gen")) == decoded + steps  # a token every step
    assert calls == [8] * 12 + [4]
    assert steps == len(calls)
    vector = np.asarray(embedded(core)["emb"].vectors[0])
    np.testing.assert_allclose(vector, whole(core, LONG), atol=1e-5)
    core.run_until_idle()
    assert core.stats().kv_blocks_used == 0


def test_inputs_share_forward_calls_and_come_back_in_order(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    calls = record_embedding_calls(core)
    inputs = [[5, 6, 7], LONG[:11], [9], LONG[:11]]
    core.send(Embed("emb", inputs))
    core.run_until_idle()
    assert calls == [8, 8, 8, 2]  # 26 tokens, 8 a step: short inputs ride with the others
    got = embedded(core)["emb"]
    assert got.num_tokens == 26
    for vector, ids in zip(got.vectors, inputs, strict=True):
        np.testing.assert_allclose(vector, whole(core, ids), atol=1e-5)
    assert core.stats().kv_blocks_used == 0 and not core.engine.embedder.jobs


def test_an_aborted_embedding_frees_its_blocks_and_others_go_on(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)
    core.send(Embed("gone", [LONG]))
    core.send(Embed("kept", [[1, 2, 3]]))
    core.tick()
    assert core.stats().kv_blocks_used > 0
    core.send(Abort(["gone"]))
    core.run_until_idle()
    assert set(embedded(core)) == {"kept"}
    assert core.stats().kv_blocks_used == 0 and not core.engine.embedder.jobs


def test_a_failed_embedding_forward_fails_its_requests_only(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch)

    def failing(chunks: list[SeqChunk]) -> Any:
        raise RuntimeError("injected embedding fault")

    core.engine.runner.hidden_states = failing  # type: ignore[method-assign]
    core.send(Embed("emb", [LONG]))
    core.send(Submit("gen", COUNTING, greedy(4)))
    core.run_until_idle()
    assert {r.rid: r.reason for r in core.rejected()} == {"emb": RejectReason.INTERNAL}
    assert [ev.finish for ev in core.events() if ev.finish] == [FinishReason.LENGTH]
    assert core.stats().kv_blocks_used == 0 and not core.engine.embedder.jobs


def test_embeddings_are_refused_while_draining_and_cut_at_the_drain_deadline(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny.succ, monkeypatch, drain_timeout_s=5.0)
    core.send(Embed("running", [LONG]))
    core.tick()
    core.engine.drain()
    core.send(Embed("late", [[1, 2]]))
    core.tick()
    core.clock.now += 10  # past the drain deadline
    core.tick()
    assert {r.rid: r.reason for r in core.rejected()} == {
        "late": RejectReason.SHUTTING_DOWN,
        "running": RejectReason.SHUTTING_DOWN,
    }
    assert not core.engine.has_work() and core.stats().kv_blocks_used == 0

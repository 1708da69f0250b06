"""A live core with faults injected (tests/fixtures/faulty_core.py): one request's failure
is that request's; a core whose every step fails exits non-zero for its supervisor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.protocol import FinishReason, RejectReason
from tests.conftest import TinyModels
from tests.fixtures.engine_cores import BASE, Reference, client_of, greedy, random_prompt
from tests.fixtures.processes import SpawnedCore

pytestmark = pytest.mark.integration

FORWARD, SAMPLE, SUBMIT, STICKY = 251, 252, 253, 254  # a prompt [0, id, ...] is poisoned
FAULTS = f"forward={FORWARD},sample={SAMPLE},submit={SUBMIT},sticky={STICKY}"


def faulty_core(tmp: pytest.TempPathFactory, tiny: TinyModels, name: str) -> SpawnedCore:
    settings = {"model_dir": str(tiny.gguf_quant), **BASE}
    entry = ("-m", "tests.fixtures.faulty_core", "--faults", FAULTS)
    return SpawnedCore(tmp.mktemp(name), settings, entry).start()


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[SpawnedCore]:
    c = faulty_core(tmp_path_factory, tiny, "faulty")
    yield c
    c.stop()


def test_poisoned_requests_fail_alone_and_the_others_are_served(
    core: SpawnedCore, ref: Reference
) -> None:
    c = client_of(core)
    good = {f"good{i}": random_prompt(40 + i, 10) for i in range(4)}
    for rid, p in good.items():
        c.submit(rid, p, greedy(12, ignore_eos=True))
    c.submit("bad-sample", [0, SAMPLE, 2], greedy(12, ignore_eos=True))
    c.submit("bad-submit", [0, SUBMIT, 2], greedy(12, ignore_eos=True))
    outs = c.collect([*good, "bad-sample", "bad-submit"])
    for rid, p in good.items():
        assert outs[rid].finish == FinishReason.LENGTH, rid
        assert outs[rid].token_ids == ref.greedy(p, 12), rid
    assert outs["bad-sample"].finish == FinishReason.ERROR
    assert outs["bad-sample"].token_ids == []
    assert [r.reason for r in outs["bad-submit"].rejected] == [RejectReason.INTERNAL]
    s = c.wait_stats(lambda s: s.active_sequences == 0)
    assert (s.kv_blocks_used, s.queue_depth) == (0, 0)


def test_a_failed_forward_fails_its_step_and_later_requests_are_served(
    core: SpawnedCore, ref: Reference
) -> None:
    c = client_of(core)
    c.submit("bad-forward", [0, FORWARD, 2], greedy(12, ignore_eos=True))
    assert c.collect(["bad-forward"])["bad-forward"].finish == FinishReason.ERROR
    prompt = random_prompt(50, 10)
    out = c.generate("after", prompt, greedy(12, ignore_eos=True))
    assert (out.finish, out.token_ids) == (FinishReason.LENGTH, ref.greedy(prompt, 12))
    assert core.proc is not None and core.proc.poll() is None
    assert c.wait_stats(lambda s: s.active_sequences == 0).kv_blocks_used == 0


def test_a_core_whose_every_step_fails_exits_non_zero(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels
) -> None:
    broken = faulty_core(tmp_path_factory, tiny, "broken")
    try:
        c = client_of(broken)
        c.submit("poison", [0, STICKY, 2], greedy(4))
        assert c.collect(["poison"])["poison"].finish == FinishReason.ERROR
        for i in range(5):  # every later step fails too; the third in a row ends the core
            c.submit(f"r{i}", random_prompt(60 + i, 6), greedy(4))
            c.wait_until(lambda i=i: c.outcome(f"r{i}").done or c.shutdown is not None, 30, "r")
            if c.shutdown is not None:
                break
        assert c.shutdown is not None and c.shutdown.fatal
        assert broken.wait(30) == 1
    finally:
        broken.stop()

"""A real `python -m enginecore` process on an ipc socket, driven over the wire protocol.

Cores with the same config are shared per module; every wait has a timeout (see processes.py).
The oracle is the float64 reference on the same (dequantized) weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shared.protocol import Bye, FinishReason, RejectReason, SamplingParams, Submit
from tests.conftest import TinyModels
from tests.fixtures import reference
from tests.fixtures.processes import CoreProcess, ProtocolClient

pytestmark = pytest.mark.integration

BASE = {
    "block_size": 4,
    "num_kv_blocks": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 32,
    "prefill_chunk": 8,
}


def greedy(max_tokens: int, ignore_eos: bool = False) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


def text(s: str) -> list[int]:
    return list(s.encode())


def random_prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


class Reference:
    """The float64 oracle on the core's weights."""

    def __init__(self, path: Path) -> None:
        self.cfg, self.state = reference.state_from_gguf(path)

    def greedy(self, prompt: list[int], n: int, stop: frozenset[int] = frozenset()) -> list[int]:
        return reference.greedy(self.cfg, self.state, prompt, n, set(stop))

    def embedding(self, ids: list[int]) -> np.ndarray:
        _, hidden = reference.forward(self.cfg, self.state, ids)
        mean = hidden.mean(axis=0)
        return np.asarray(mean / np.linalg.norm(mean))


def start(
    tmp: pytest.TempPathFactory, tiny: TinyModels, name: str, **engine: object
) -> CoreProcess:
    settings = {"model_dir": str(tiny.gguf_quant), **BASE, **engine}
    return CoreProcess(tmp.mktemp(name), settings).start()


@pytest.fixture(scope="module")
def ref(tiny: TinyModels) -> Reference:
    return Reference(tiny.gguf_quant)


@pytest.fixture(scope="module")
def main_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[CoreProcess]:
    core = start(tmp_path_factory, tiny, "main")
    yield core
    core.stop()


@pytest.fixture(scope="module")
def spec_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[CoreProcess]:
    core = start(tmp_path_factory, tiny, "spec", speculative="prompt_lookup", prefix_cache="none")
    yield core
    core.stop()


@pytest.fixture(scope="module")
def small_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[CoreProcess]:
    """24 blocks of 4 tokens: four 48-token requests must preempt each other."""
    core = start(tmp_path_factory, tiny, "small", num_kv_blocks=24)
    yield core
    core.stop()


@pytest.fixture(scope="module")
def slow_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[CoreProcess]:
    """One sequence at a time, one waiting at most, slow steps, short queue deadline."""
    core = start(
        tmp_path_factory, tiny, "slow",
        max_num_seqs=1, queue_capacity=1, step_delay_ms=20, queue_deadline_ms=500,
    )  # fmt: skip
    yield core
    core.stop()


@pytest.fixture(scope="module")
def abort_core(tmp_path_factory: pytest.TempPathFactory, tiny: TinyModels) -> Iterator[CoreProcess]:
    core = start(tmp_path_factory, tiny, "abort", step_delay_ms=20, client_timeout_s=2.0)
    yield core
    core.stop()


def client_of(core: CoreProcess) -> ProtocolClient:
    c = core.client()
    c.hello()
    return c


@pytest.fixture
def main(main_core: CoreProcess) -> ProtocolClient:
    return client_of(main_core)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"max_num_seq": 4}, "max_num_seq"),  # a typo of max_num_seqs
        ({"block_size": 3}, "block_size"),
        ({"model_dir": "/nonexistent/model.gguf"}, "cannot start"),
    ],
)
def test_a_core_that_cannot_start_exits_2(
    tmp_path: Path, tiny: TinyModels, engine: dict[str, object], message: str
) -> None:
    settings = {"model_dir": str(tiny.gguf_quant), **engine}
    code, output = CoreProcess(tmp_path, settings).run_to_exit()
    assert code == 2, output
    assert message in output


# ---- correctness against the reference ----------------------------------------------------

PROMPTS = [
    text("Hello, world!"),  # the tiny model's first greedy token is EOS: finish = stop
    text("The quick brown fox"),
    text("x"),
    list(range(40, 90)),  # longer than prefill_chunk: chunked prefill
]


def test_welcome_describes_the_model(main_core: CoreProcess) -> None:
    w = main_core.welcome
    assert w is not None
    assert (w.model_id, w.vocab_size, w.max_model_len, w.block_size) == ("tiny-q", 260, 1024, 4)
    assert 256 in w.eos_ids
    assert main_core.proc is not None
    assert w.core_pid == main_core.proc.pid


@pytest.mark.parametrize("prompt", PROMPTS, ids=["eos", "fox", "x", "long"])
def test_greedy_ids_equal_reference(
    main: ProtocolClient, ref: Reference, prompt: list[int]
) -> None:
    assert main.welcome is not None
    eos = frozenset(main.welcome.eos_ids)
    want = ref.greedy(prompt, 24, eos)
    out = main.generate(f"greedy-{len(prompt)}", prompt, greedy(24))
    assert out.token_ids == want
    assert out.finish == (FinishReason.STOP if want[-1] in eos else FinishReason.LENGTH)
    assert out.num_prompt_tokens == len(prompt)
    assert out.rejected == []


def test_concurrent_requests_equal_serial(main: ProtocolClient, ref: Reference) -> None:
    prompts = {f"c{i}": random_prompt(i, 1 + 4 * i) for i in range(16)}
    lengths = {rid: 8 + i % 9 for i, rid in enumerate(prompts)}
    serial = {
        rid: main.generate(rid, p, greedy(lengths[rid], ignore_eos=True)).token_ids
        for rid, p in prompts.items()
    }
    for rid, p in prompts.items():
        main.submit(rid, p, greedy(lengths[rid], ignore_eos=True))
    together = main.collect(prompts)
    assert {rid: o.token_ids for rid, o in together.items()} == serial
    assert all(o.finish == FinishReason.LENGTH for o in together.values())
    for rid in ("c0", "c7", "c15"):
        assert serial[rid] == ref.greedy(prompts[rid], lengths[rid])


SEEDED = SamplingParams(max_tokens=24, temperature=0.8, seed=7, ignore_eos=True)


def test_seeded_sampling_repeats_alone_and_in_a_busy_batch(main: ProtocolClient) -> None:
    prompt = text("Once upon a time")
    first = main.generate("seeded-1", prompt, SEEDED).token_ids
    assert main.generate("seeded-2", prompt, SEEDED).token_ids == first
    other_seed = SamplingParams(max_tokens=24, temperature=0.8, seed=8, ignore_eos=True)
    assert main.generate("seeded-3", prompt, other_seed).token_ids != first
    noise = [
        greedy(30, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.5, top_k=5, ignore_eos=True),
    ]
    for i in range(6):
        main.submit(f"noise-{i}", random_prompt(100 + i, 3 + 7 * i), noise[i % 3])
        if i == 2:
            main.submit("seeded-busy", prompt, SEEDED)
    outs = main.collect(["seeded-busy", *(f"noise-{i}" for i in range(6))])
    assert outs["seeded-busy"].token_ids == first


def test_shared_prefix_reports_cached_tokens(main: ProtocolClient, ref: Reference) -> None:
    base = random_prompt(700, 40)  # a seed no other test on this core uses
    first = main.generate("prefix-a", base, greedy(4, ignore_eos=True))
    assert first.num_cached_tokens == 0
    before = main.stats()
    prompt = base[:36] + text("different tail")
    out = main.generate("prefix-b", prompt, greedy(8, ignore_eos=True))
    assert out.num_cached_tokens == 36  # nine whole blocks of 4
    assert out.token_ids == ref.greedy(prompt, 8)
    after = main.stats()
    assert after.prefix_cache_hits - before.prefix_cache_hits == 36
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(prompt)


def test_embeddings_are_normalized_mean_hidden_states_in_order(
    main: ProtocolClient, ref: Reference
) -> None:
    inputs = [text("first input"), [7], random_prompt(3, 37), text("first input")]
    got = main.embed("emb", inputs)
    assert got is not None
    assert got.num_tokens == sum(map(len, inputs))
    assert len(got.vectors) == len(inputs)
    for vec, ids in zip(got.vectors, inputs, strict=True):
        v = np.asarray(vec)
        assert abs(np.linalg.norm(v) - 1) < 1e-6
        np.testing.assert_allclose(v, ref.embedding(ids), atol=2e-3)
    np.testing.assert_array_equal(got.vectors[0], got.vectors[3])
    assert main.embed("emb-bad", [text("ok"), []]) is None
    assert main.outcome("emb-bad").rejected[0].reason == RejectReason.INVALID
    assert main.stats().kv_blocks_used == 0


def test_bad_requests_are_rejected_and_the_core_keeps_serving(
    main: ProtocolClient, ref: Reference
) -> None:
    bad = {
        "too-big-id": ([1, 2, 260], greedy(4), RejectReason.INVALID),
        "negative-id": ([1, -1], greedy(4), RejectReason.INVALID),
        "empty": ([], greedy(4), RejectReason.INVALID),
        "no-tokens": ([1, 2], SamplingParams(max_tokens=0), RejectReason.INVALID),
        "too-long": ([1] * 1000, greedy(25), RejectReason.CONTEXT_LENGTH_EXCEEDED),
        # sampling params the frontend should have refused; min_p > 1 used to crash the loop
        "min-p": ([1, 2], SamplingParams(max_tokens=4, min_p=1.5), RejectReason.INVALID),
        "top-p": ([1, 2], SamplingParams(max_tokens=4, top_p=0.0), RejectReason.INVALID),
        "nan-temp": (
            [1],
            SamplingParams(max_tokens=4, temperature=float("nan")),
            RejectReason.INVALID,
        ),
    }
    for rid, (prompt, params, _) in bad.items():
        main.submit(rid, prompt, params)
    outs = main.collect(bad)
    assert {rid: [r.reason for r in o.rejected] for rid, o in outs.items()} == {
        rid: [reason] for rid, (_, _, reason) in bad.items()
    }
    assert all(o.token_ids == [] for o in outs.values())
    assert main.generate("after", text("fine"), greedy(6, ignore_eos=True)).token_ids == (
        ref.greedy(text("fine"), 6)
    )


def test_each_frontend_gets_only_its_own_events(main_core: CoreProcess) -> None:
    a, b = client_of(main_core), client_of(main_core)
    a.submit("mine-a", text("one"), greedy(5, ignore_eos=True))
    b.submit("mine-b", text("two"), greedy(5, ignore_eos=True))
    assert len(a.collect(["mine-a"])["mine-a"].token_ids) == 5
    assert len(b.collect(["mine-b"])["mine-b"].token_ids) == 5
    assert set(a.outcomes) == {"mine-a"}
    assert set(b.outcomes) == {"mine-b"}


def test_undecodable_messages_are_dropped(main: ProtocolClient, ref: Reference) -> None:
    main.sock.send(b"\xc1 not msgpack")
    main.sock.send_multipart([b"two", b"frames"])
    out = main.generate("still-serving", text("ok"), greedy(4, ignore_eos=True))
    assert out.token_ids == ref.greedy(text("ok"), 4)


# ---- speculative decoding ------------------------------------------------------------------

REPETITIVE = [text("x"), text("abcabcabcabcabc"), text("the cat the cat the cat"), [87] * 12]


def test_prompt_lookup_gives_the_same_greedy_ids(
    main_core: CoreProcess, spec_core: CoreProcess, ref: Reference
) -> None:
    plain, spec = client_of(main_core), client_of(spec_core)
    before = spec.stats()
    rids = [f"rep-{i}" for i in range(len(REPETITIVE))]
    for c in (plain, spec):
        for rid, p in zip(rids, REPETITIVE, strict=True):
            c.submit(rid, p, greedy(48, ignore_eos=True))
    a, b = plain.collect(rids), spec.collect(rids)
    for rid, p in zip(rids, REPETITIVE, strict=True):
        assert b[rid].token_ids == a[rid].token_ids == ref.greedy(p, 48), rid
    after = spec.stats()
    assert after.spec_accepted_total > before.spec_accepted_total
    assert after.spec_proposed_total >= after.spec_accepted_total
    assert plain.stats().spec_proposed_total == 0
    assert sum(o.num_events for o in b.values()) < sum(o.num_events for o in a.values())


def test_prompt_lookup_keeps_seeded_sampling_unchanged(
    main_core: CoreProcess, spec_core: CoreProcess
) -> None:
    """Verified drafts spend one uniform per emitted token, like plain decoding."""
    plain, spec = client_of(main_core), client_of(spec_core)
    before = spec.stats().spec_proposed_total
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, ignore_eos=True)
    for i, p in enumerate(REPETITIVE):
        a = plain.generate(f"seeded-rep-{i}", p, params).token_ids
        assert spec.generate(f"seeded-rep-{i}", p, params).token_ids == a
    assert spec.stats().spec_proposed_total > before


def test_prefix_cache_none_reports_no_cached_tokens(spec_core: CoreProcess) -> None:
    c = client_of(spec_core)
    base = random_prompt(11, 40)
    c.generate("none-a", base, greedy(2, ignore_eos=True))
    out = c.generate("none-b", base[:36] + [1, 2, 3], greedy(2, ignore_eos=True))
    assert out.num_cached_tokens == 0
    s = c.stats()
    assert (s.prefix_cache_hits, s.kv_blocks_cached) == (0, 0)


# ---- preemption ----------------------------------------------------------------------------


def test_preempted_requests_resume_with_unchanged_output(
    small_core: CoreProcess, ref: Reference
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


def test_a_request_larger_than_the_whole_cache_is_no_capacity(small_core: CoreProcess) -> None:
    c = client_of(small_core)
    out = c.generate("huge", random_prompt(1, 50), greedy(50))  # 100 slots > 24 blocks of 4
    assert [r.reason for r in out.rejected] == [RejectReason.NO_CAPACITY]
    assert c.embed("huge-embed", [random_prompt(2, 100)]) is None
    assert [r.reason for r in c.outcome("huge-embed").rejected] == [RejectReason.NO_CAPACITY]
    assert len(c.generate("fits", random_prompt(3, 50), greedy(46)).token_ids) > 0


# ---- admission -------------------------------------------------------------------------------


def test_queue_full_is_rejected_at_once(slow_core: CoreProcess, ref: Reference) -> None:
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


def test_waiting_past_the_deadline_is_no_capacity(slow_core: CoreProcess) -> None:
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


def test_abort_frees_every_block_before_the_next_step(abort_core: CoreProcess) -> None:
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


def test_a_silent_frontend_has_its_requests_aborted(abort_core: CoreProcess) -> None:
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


def test_bye_aborts_everything_the_frontend_owns(abort_core: CoreProcess) -> None:
    leaving = client_of(abort_core)
    for i in range(3):
        leaving.submit(f"bye{i}", random_prompt(60 + i, 8), greedy(500, ignore_eos=True))
    leaving.wait_tokens("bye2", 1)
    leaving.send(Bye())
    s = leaving.stats()  # after the Bye: ordered on this socket
    assert (s.active_sequences, s.kv_blocks_used, s.queue_depth) == (0, 0, 0)


def test_a_duplicate_rid_is_refused_while_the_first_carries_on(abort_core: CoreProcess) -> None:
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

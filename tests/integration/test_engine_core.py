"""A real `python -m enginecore` process on an ipc socket, driven over the wire protocol.

Cores with the same config are shared per module; every wait has a timeout (see processes.py).
The oracle is the float64 reference on the same (dequantized) weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shared.protocol import FinishReason, RejectReason, SamplingParams
from tests.conftest import TinyModels
from tests.fixtures.engine_cores import (
    SEEDED,
    Reference,
    client_of,
    greedy,
    random_prompt,
    text,
)
from tests.fixtures.processes import ProtocolClient, SpawnedCore

pytestmark = pytest.mark.integration


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
    code, output = SpawnedCore(tmp_path, settings).run_to_exit()
    assert code == 2, output
    assert message in output


# ---- correctness against the reference ----------------------------------------------------

PROMPTS = [
    text("Hello, world!"),  # the tiny model's first greedy token is EOS: finish = stop
    text("The quick brown fox"),
    text("x"),
    list(range(40, 90)),  # longer than prefill_chunk: chunked prefill
]


def test_welcome_describes_the_model(main_core: SpawnedCore) -> None:
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


def test_a_partial_block_hit_gives_the_reference_output(
    main: ProtocolClient, ref: Reference
) -> None:
    base = random_prompt(701, 42)  # a seed no other test on this core uses
    first = main.generate("partial-a", base, greedy(4, ignore_eos=True))
    assert first.num_cached_tokens == 0
    # 45 positions computed (42 prompt + 3 outputs): 11 whole blocks of 4 published
    prompt = [*base[:38], (base[38] + 1) % 256, *text(" then a tail")]
    out = main.generate("partial-b", prompt, greedy(8, ignore_eos=True))
    assert out.num_cached_tokens == 38  # 9 whole blocks, and 2 slots copied from the tenth
    assert out.token_ids == ref.greedy(prompt, 8)
    again = main.generate("partial-c", base, greedy(4, ignore_eos=True))
    assert again.num_cached_tokens == 41  # all but the last prompt token, 1 slot copied
    assert again.token_ids == first.token_ids == ref.greedy(base, 4)


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
        "no-tokens": ([1, 2], SamplingParams(max_tokens=-1), RejectReason.INVALID),  # 0 scores
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


def test_each_frontend_gets_only_its_own_events(main_core: SpawnedCore) -> None:
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
    main_core: SpawnedCore, spec_core: SpawnedCore, ref: Reference
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
    main_core: SpawnedCore, spec_core: SpawnedCore
) -> None:
    """Verified drafts spend one uniform per emitted token, like plain decoding."""
    plain, spec = client_of(main_core), client_of(spec_core)
    before = spec.stats().spec_proposed_total
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, ignore_eos=True)
    for i, p in enumerate(REPETITIVE):
        a = plain.generate(f"seeded-rep-{i}", p, params).token_ids
        assert spec.generate(f"seeded-rep-{i}", p, params).token_ids == a
    assert spec.stats().spec_proposed_total > before


def test_prefix_cache_none_reports_no_cached_tokens(spec_core: SpawnedCore) -> None:
    c = client_of(spec_core)
    base = random_prompt(11, 40)
    c.generate("none-a", base, greedy(2, ignore_eos=True))
    out = c.generate("none-b", base[:36] + [1, 2, 3], greedy(2, ignore_eos=True))
    assert out.num_cached_tokens == 0
    s = c.stats()
    assert (s.prefix_cache_hits, s.kv_blocks_cached) == (0, 0)

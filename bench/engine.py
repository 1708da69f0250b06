"""Engine-level benchmark: drive a real core process over the wire protocol (no HTTP).

Prints, on the bundled model:
  1. aggregate output tokens/s at 1, 4, 16 and 64 concurrent requests (32-token prompts,
     128 tokens each, greedy, EOS ignored), beside the throughput the run would reach if its
     steps cost only their fp32 matmuls in numpy BLAS (the prompts' prefill, then the decodes);
  2. time to first token of a request sharing a 1,000-token prefix with an earlier one,
     prefix cache on and off;
  3. single-stream tokens/s with prompt lookup on and off (best of 3 runs each), on a task
     that repeats its input and on one that does not;
  4. llama.cpp's `llama-batched-bench` on the same GGUF and load (B = the levels, prompts of
     --prompt-len tokens, --out-tokens generated), when `python -m bench.llamacpp build` ran;
  5. what grammars cost: 64 concurrent `json_object` requests beside the same 64 requests
     unconstrained, each made as long as its constrained twin (so both runs batch alike),
     and what the grammar code costs a step whose rows are all unconstrained.

    python -m bench.engine [--levels 1,4,16,64] [--prompt-len 32]
                           [--only throughput,llama,grammar,prefix,lookup] [--out bench/out/engine.json]

`--only` runs some of the sections (1 and 5 share one core process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import cast

import numpy as np
import zmq

from bench.llama_bench import batched_bench_lines
from enginecore.logits_mask import LogitsMasker
from enginecore.sampler import RowInfo, SampleSeq
from frontend.text.chat_template import ChatTemplate
from shared.config import BUNDLED_MODEL, EngineConfig
from shared.grammar import json_object_grammar
from shared.protocol import (
    GetStats,
    Heartbeat,
    Hello,
    Rejected,
    SamplingParams,
    Stats,
    Step,
    Submit,
    Welcome,
    encoder,
    frontend_decoder,
)
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import read_tokenizer_metadata

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN = 32  # tokens per request of the throughput levels (default of --prompt-len)
REPEAT_RUNS = 3  # of the prompt-lookup task, per setting
STEP_TOKENS = EngineConfig().max_num_batched_tokens  # the core's per-step token budget
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt "
    "and wind. Every night for ninety years its lamp had turned, warning ships away from the rocks "
    "below. When the keeper finally retired, the town voted to keep the light burning, and volunteers "
    "took turns climbing the one hundred and twelve steps to clean the great glass lens."
)


class Core:
    """A core process on an ipc socket, and one DEALER client speaking the protocol."""

    def __init__(self, **overrides: object) -> None:
        self.dir = tempfile.mkdtemp(prefix="tl-bench-")
        address = f"ipc://{self.dir}/core.sock"
        env = dict(os.environ, TL_ENGINE__CORE_ADDRESS=address, TL_ENGINE__LOG_LEVEL="warning")
        env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))
        for k, v in overrides.items():
            env[f"TL_ENGINE__{k.upper()}"] = json.dumps(v) if not isinstance(v, str) else v
        self.proc = subprocess.Popen([sys.executable, "-m", "enginecore"], env=env, cwd=ROOT)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.enc, self.dec = encoder(), frontend_decoder()
        self.sock.send(self.enc.encode(Hello("bench")))
        if not self.sock.poll(300_000):
            raise RuntimeError("core did not answer Hello")
        welcome = self.dec.decode(self.sock.recv())
        assert isinstance(welcome, Welcome)
        self.welcome = welcome

    def run(self, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[float]]:
        """Submit all at once; per request: time to first token, finish time, tokens."""
        return self.run_each(prompts, [params] * len(prompts))

    def run_each(
        self, prompts: list[list[int]], params: list[SamplingParams]
    ) -> dict[str, list[float]]:
        """`run`, each prompt with its own params."""
        t0 = time.perf_counter()
        rids = [uuid.uuid4().hex for _ in prompts]
        for rid, p, sp in zip(rids, prompts, params, strict=True):
            self.sock.send(self.enc.encode(Submit(rid, p, sp)))
        first: dict[str, float] = {}
        done: dict[str, float] = {}
        count = dict.fromkeys(rids, 0)
        last_beat = time.monotonic()
        while len(done) < len(rids):
            if time.monotonic() - last_beat > 1.0:  # a silent frontend has its requests aborted
                self.sock.send(self.enc.encode(Heartbeat()))
                last_beat = time.monotonic()
            if not self.sock.poll(1000):
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError("core stopped answering")
                continue
            msg = self.dec.decode(self.sock.recv())
            now = time.perf_counter() - t0
            if isinstance(msg, Rejected):
                raise RuntimeError(f"rejected: {msg}")
            if not isinstance(msg, Step):
                continue
            for ev in msg.events:
                if ev.token_ids and ev.rid not in first:
                    first[ev.rid] = now
                count[ev.rid] += len(ev.token_ids)
                if ev.finish is not None:
                    done[ev.rid] = now
        return {
            "ttft": [first[r] for r in rids],
            "done": [done[r] for r in rids],
            "tokens": [float(count[r]) for r in rids],
        }

    def stats(self) -> Stats:
        self.sock.send(self.enc.encode(GetStats()))
        while True:
            msg = self.dec.decode(self.sock.recv())
            if isinstance(msg, Stats):
                return msg

    def __enter__(self) -> Core:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.sock.close(0)
        self.ctx.term()


def blas_matmul_seconds(rows: int, head_rows: int, repeats: int = 5) -> float:
    """numpy fp32 time of one step's matmuls: every layer matrix at `rows`, lm_head at `head_rows`."""
    d, ffn, q, kv, vocab, layers = 576, 1536, 576, 192, 49152, 30
    rng = np.random.default_rng(0)
    mats = [
        rng.standard_normal(s, dtype=np.float32)
        for s in [(q + 2 * kv, d), (d, q), (2 * ffn, d), (d, ffn)]
    ]
    head = rng.standard_normal((vocab, d), dtype=np.float32)
    xs = {w.shape[1]: np.ones((rows, w.shape[1]), np.float32) for w in mats}
    hx = np.ones((head_rows, d), np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _layer in range(layers):
            for w in mats:
                xs[w.shape[1]] @ w.T
        hx @ head.T
        best = min(best, time.perf_counter() - t)
    return best


def blas_run_tokens_per_s(concurrency: int, prompt_len: int, out_tokens: int) -> float:
    """Output tokens/s if the run's steps cost only their matmuls in numpy BLAS: the prompts'
    prefill in steps of STEP_TOKENS rows (each sampling its first token), then out_tokens - 1
    decode steps of `concurrency` rows."""
    prompt_rows = concurrency * prompt_len
    full, rest = divmod(prompt_rows, STEP_TOKENS)
    prefill = full * blas_matmul_seconds(STEP_TOKENS, 0) + (
        blas_matmul_seconds(rest, 0) if rest else 0.0
    ) + blas_matmul_seconds(0, concurrency)  # fmt: skip
    decode = (out_tokens - 1) * blas_matmul_seconds(concurrency, concurrency)
    return concurrency * out_tokens / (prefill + decode)


def random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, 40000, length).tolist() for _ in range(n)]


def throughput(
    levels: list[int], prompt_len: int, out_tokens: int, grammar: bool
) -> dict[str, object]:
    """Sections 1 (if levels) and 5 (if grammar), on one core process."""
    result: dict[str, object] = {}
    with Core() as core:
        if levels:
            result["throughput"] = _throughput(core, levels, prompt_len, out_tokens)
        if grammar:
            result["json_object"] = grammar_overhead(core, 64, out_tokens)
    return result


def chat_prompts(contents: list[str]) -> list[list[int]]:
    """Each content as one user message, rendered by the bundled model's template."""
    card = read_tokenizer_metadata(Path(BUNDLED_MODEL).expanduser())
    tok = Tokenizer(card)
    template = ChatTemplate(card.chat_template or "", card.bos_token, card.eos_token)
    return [
        tok.encode(template.render([{"role": "user", "content": c}], add_generation_prompt=True))
        for c in contents
    ]


_KINDS = [
    ("people", "names, ages and cities"),
    ("books", "titles, authors and years"),
    ("cities", "names, countries and populations"),
    ("cars", "makes, models and prices"),
]
# 64 requests for long JSON documents (a prompt of random tokens gets `{}` at once)
JSON_ASKS = [
    f"Write a JSON object that lists {5 + i} {kind} with their {fields}."
    for i, (kind, fields) in enumerate(_KINDS * 16)
]


def grammar_overhead(core: Core, concurrency: int, out_tokens: int) -> dict[str, float]:
    """json_object requests (each ends when its document does, at most out_tokens), then the
    same prompts unconstrained with each one's max_tokens set to its twin's length."""
    prompts = chat_prompts(JSON_ASKS[:concurrency])
    grammar = json_object_grammar()
    params = SamplingParams(
        max_tokens=out_tokens, temperature=0.0, ignore_eos=True, grammar=grammar
    )
    core.run(prompts[:2], params)  # warm
    before = core.stats()
    lengths = [int(n) for n in core.run(prompts, params)["tokens"]]
    after = core.stats()
    twins = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    constrained_s = free_s = float("inf")
    for _ in range(3):  # alternating, best of three each: the machine drifts between runs
        t0 = time.perf_counter()
        free = core.run_each(prompts, twins)
        free_s = min(free_s, time.perf_counter() - t0)
        assert [int(n) for n in free["tokens"]] == lengths
        t0 = time.perf_counter()
        core.run(prompts, params)
        constrained_s = min(constrained_s, time.perf_counter() - t0)
    steps = after.grammar_masked_steps_total - before.grammar_masked_steps_total
    mask_s = after.grammar_mask_seconds_total - before.grammar_mask_seconds_total
    row = {"concurrency": concurrency, "tokens": float(sum(lengths)),
           "json_object_tokens_per_s": sum(lengths) / constrained_s,
           "unconstrained_tokens_per_s": sum(lengths) / free_s,
           "mask_ms_per_step": 1000 * mask_s / max(steps, 1)}  # fmt: skip
    row["ratio"] = row["json_object_tokens_per_s"] / row["unconstrained_tokens_per_s"]
    # what an unconstrained step runs of the grammar code: the masker's look at each sequence
    row["unconstrained_check_us_per_step"] = unconstrained_check_us(core, concurrency)
    row["unconstrained_ms_per_step"] = 1000 * free_s / max(lengths)
    print(f"  {concurrency} json_object streams: {row['json_object_tokens_per_s']:7.1f} tok/s, "
          f"the same {concurrency} unconstrained (same lengths, {sum(lengths)} tokens): "
          f"{row['unconstrained_tokens_per_s']:7.1f} tok/s, ratio {row['ratio']:.3f}; "
          f"mask {row['mask_ms_per_step']:.2f} ms per step")  # fmt: skip
    print(f"  {concurrency} unconstrained rows: the grammar check costs "
          f"{row['unconstrained_check_us_per_step']:.2f} us per step beside a "
          f"step of {row['unconstrained_ms_per_step']:.1f} ms")  # fmt: skip
    return row


def unconstrained_check_us(core: Core, concurrency: int) -> float:
    """Best time of LogitsMasker.apply on `concurrency` unconstrained sequences (the grammar
    code every step runs; a sequence's other grammar tests are one `is None` each)."""
    masker = LogitsMasker(core.welcome.vocab_size)
    logits = np.zeros((concurrency, core.welcome.vocab_size), np.float32)
    seqs = [SampleSeq(cast(RowInfo, None), 1, []) for _ in range(concurrency)]
    best = float("inf")
    for _ in range(2000):
        t0 = time.perf_counter()
        masker.apply(logits, seqs)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def _throughput(
    core: Core, levels: list[int], prompt_len: int, out_tokens: int
) -> list[dict[str, float]]:
    params = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
    core.run(random_prompts(2, 32, 99), params)  # warm
    rows = []
    for c in levels:
        t0 = time.perf_counter()
        r = core.run(random_prompts(c, prompt_len, c), params)
        wall = time.perf_counter() - t0
        tok_s = sum(r["tokens"]) / wall
        blas = blas_run_tokens_per_s(c, prompt_len, out_tokens)
        rows.append({"concurrency": c, "tokens_per_s": tok_s, "ttft_p50_s": statistics.median(r["ttft"]),
                     "blas_matmul_tokens_per_s": blas, "ratio_to_blas": tok_s / blas})  # fmt: skip
        print(f"  {c:3d} concurrent: {tok_s:7.1f} tok/s   TTFT p50 {rows[-1]['ttft_p50_s'] * 1000:7.0f} ms   "
              f"numpy BLAS matmuls alone {blas:7.1f} tok/s   ratio {rows[-1]['ratio_to_blas']:.2f}")  # fmt: skip
    return rows


def prefix_ttft(prefix_cache: str, repeats: int = 5) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prefix = random_prompts(1, 1000, 7)[0]
    with Core(prefix_cache=prefix_cache) as core:
        core.run([prefix + [11, 12, 13]], params)  # the earlier request
        ttfts = [core.run([prefix + [20 + i, 21, 22]], params)["ttft"][0] for i in range(repeats)]
    return statistics.median(ttfts)


# prompt-lookup tasks: one that repeats its input (drafts mostly right), one that does not
TASKS = {
    "repeat-the-paragraph": f"Repeat this paragraph exactly:\n\n{PARAGRAPH}",
    "write-a-story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def task_tokens_per_s(speculative: str, prompts: list[list[int]]) -> list[tuple[float, int, int]]:
    """Per prompt: best decode tokens/s of REPEAT_RUNS runs, drafts proposed and accepted per run."""
    out = []
    with Core(speculative=speculative) as core:
        core.run(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm
        for prompt in prompts:
            before, rates = core.stats(), []
            for _ in range(REPEAT_RUNS):  # best of a few: one run moved +-10% on this machine
                r = core.run([prompt], SamplingParams(max_tokens=128, temperature=0.0))
                rates.append(r["tokens"][0] / (r["done"][0] - r["ttft"][0]))
            after = core.stats()
            proposed = (after.spec_proposed_total - before.spec_proposed_total) // REPEAT_RUNS
            accepted = (after.spec_accepted_total - before.spec_accepted_total) // REPEAT_RUNS
            out.append((max(rates), proposed, accepted))
    return out


def prompt_lookup() -> dict[str, dict[str, float]]:
    """Section 3: each task with prompt lookup on and off."""
    prompts = chat_prompts(list(TASKS.values()))
    spec_on = task_tokens_per_s("prompt_lookup", prompts)
    spec_off = task_tokens_per_s("none", prompts)
    lookup = {}
    for name, (on_s, proposed, accepted), (off_s, _, _) in zip(
        TASKS, spec_on, spec_off, strict=True
    ):
        print(f"  {name} task, 1 stream: prompt lookup {on_s:.1f} tok/s, off {off_s:.1f} tok/s, "
              f"{on_s / off_s:.2f}x ({accepted} of {proposed} drafts accepted)")  # fmt: skip
        lookup[name] = {"on": on_s, "off": off_s, "proposed": proposed, "accepted": accepted}
    return lookup


SECTIONS = ("throughput", "llama", "grammar", "prefix", "lookup")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help="tokens per prompt")
    parser.add_argument("--out-tokens", type=int, default=128)
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections to run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "engine.json")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        parser.error(f"--only: sections are {', '.join(SECTIONS)}")
    levels = [int(x) for x in args.levels.split(",")]
    print(
        f"engine core over the protocol, {args.prompt_len}-token prompts, {args.out_tokens} output "
        "tokens per request, greedy"
    )
    result: dict[str, object] = {}
    if "throughput" in only or "grammar" in only:
        ours = levels if "throughput" in only else []
        result.update(throughput(ours, args.prompt_len, args.out_tokens, "grammar" in only))
    if "llama" in only:
        twin = batched_bench_lines(
            Path(BUNDLED_MODEL).expanduser(), args.prompt_len, args.out_tokens, levels
        )
        print("\n".join(twin))
        result["llama_batched_bench"] = twin
    if "prefix" in only:
        on, off = prefix_ttft("radix"), prefix_ttft("none")
        print(f"  TTFT with a shared 1,000-token prefix: cache on {on * 1000:.0f} ms, "
              f"off {off * 1000:.0f} ms, {off / on:.1f}x")  # fmt: skip
        result["prefix_ttft_s"] = {"radix": on, "none": off}
    if "lookup" in only:
        result["prompt_lookup_tokens_per_s"] = prompt_lookup()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""How far each numerics mode (and llama.cpp) is from the float64 reference on the same GGUF.

`python -m bench.fidelity [--models bundled,Q4_K_M,Q8_0] [--prompts 56] [--positions 64]`
`python -m bench.fidelity --greedy`: per numerics mode and KV dtype, how many of
tests/data/greedy.json's continuations of the bundled model (48 tokens each, an independent
fp32 implementation's) the engine reproduces exactly, and where the others part.

For each model: PROMPTS chat prompts, rendered with the model's template and continued
greedily for `positions` tokens by tl-serve's exact mode (which reproduces the reference's
greedy choices); every engine then scores the same token ids, teacher-forced, and at each of
those positions its next-token distribution is compared with the float64 numpy reference's
(tests/fixtures/reference.py, on the file's dequantized weights):
mean KL(reference || engine) in nats and top-1 agreement. Engines: tl-serve in each numerics
mode (f32 and f16 KV cache) and llama.cpp (bench/llama_logits.py: f16 KV cache, its own int8
activations) when its build is present (`python -m bench.llamacpp build`; the models come
from `python -m bench.models`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import llamacpp
from bench.llama_logits import LlamaLogits
from bench.models import resolve
from enginecore.batch import Batch, SeqChunk
from enginecore.model_runner import ModelRunner
from frontend.text.chat_template import ChatTemplate
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import read_tokenizer_metadata
from tests.fixtures import reference

PROMPTS = [
    "What is the capital of France?", "Give me three tips for sleeping better.",
    "Explain photosynthesis to a child.", "Write a haiku about the sea.",
    "What is 17 times 23?", "Translate 'good night' into German.",
    "Who wrote Romeo and Juliet?", "How do I boil an egg?",
    "What is the difference between weather and climate?", "Name five fruits that are red.",
    "Write a Python function that reverses a string.", "Why is the sky blue?",
    "Summarize the plot of Cinderella in two sentences.", "What does a CPU do?",
    "Suggest a name for a pet turtle.", "How many legs does a spider have?",
    "What is the boiling point of water in Fahrenheit?", "Tell me a joke about computers.",
    "What are the primary colors?", "How do airplanes stay in the air?",
    "Write a short thank-you note to a teacher.", "What is the largest planet in our solar system?",
    "Give me a recipe for pancakes.", "What is machine learning?",
    "List the days of the week in French.", "How can I save money on groceries?",
    "What causes earthquakes?", "Describe a cat in one sentence.",
    "What is the square root of 144?", "Why do leaves change color in autumn?",
    "Write a SQL query that counts rows in a table named users.", "What is a noun?",
    "How long does it take light from the Sun to reach Earth?", "What is democracy?",
    "Give me a motivational quote.", "How do vaccines work?",
    "What is the tallest mountain in the world?", "Write a limerick about a frog.",
    "What are the benefits of drinking water?", "Explain what an atom is.",
    "How do I make a cup of tea?", "What is the speed of sound?",
    "Name three famous painters.", "What is the meaning of the word 'ephemeral'?",
    "How does a rainbow form?", "Write a two-line poem about coffee.",
    "What is the capital of Japan?", "How do bees make honey?",
    "What is an API?", "Give me a fun fact about octopuses.",
    "How do I stay focused while studying?", "What is gravity?",
    "Write a friendly greeting for a new coworker.", "What is the chemical symbol for gold?",
    "Why do we have seasons?", "Describe the taste of a lemon.",
]  # fmt: skip


def kl_and_top1(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: KL(softmax(ref) || softmax(got)) in nats, and whether the argmaxes agree."""
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    lr = r - r.max(1, keepdims=True)
    lr -= np.log(np.exp(lr).sum(1, keepdims=True))
    lg = g - g.max(1, keepdims=True)
    lg -= np.log(np.exp(lg).sum(1, keepdims=True))
    return (np.exp(lr) * (lr - lg)).sum(1), r.argmax(1) == g.argmax(1)


def continue_greedily(runner: ModelRunner, ids: list[int], steps: int) -> list[int]:
    """ids + `steps` greedy tokens (exact mode: the reference's own choices)."""
    table = list(range(-(-(len(ids) + steps) // 32)))
    out = list(ids)
    logits = runner.run(Batch.build([SeqChunk(out, 0, table, 1)], 32))
    for _ in range(steps):
        out.append(int(np.argmax(logits[-1])))
        logits = runner.run(Batch.build([SeqChunk(out[-1:], len(out) - 1, table, 1)], 32))
    return out


def prompts(path: Path, n_prompts: int) -> list[list[int]]:
    card = read_tokenizer_metadata(path)
    tok = Tokenizer(card)
    template = ChatTemplate(card.chat_template or "", card.bos_token, card.eos_token)
    return [tok.encode(template.render([{"role": "user", "content": text}], True))
            for text in PROMPTS[:n_prompts]]  # fmt: skip


def scored_rows(seq: list[int], prompt_len: int) -> slice:
    return slice(prompt_len - 1, len(seq) - 1)  # the rows that predict the continuation


def runner_logits(runner: ModelRunner) -> Callable[[list[int]], np.ndarray]:
    def run(ids: list[int]) -> np.ndarray:
        table = list(range(-(-len(ids) // 32)))
        return runner.run(Batch.build([SeqChunk(ids, 0, table, len(ids))], 32))

    return run


def load(path: Path, numerics: str, kv: str) -> ModelRunner:
    return ModelRunner.from_path(path, 32, 64, 0, 2048, numerics, kv)


def score(path: Path, n_prompts: int, positions: int) -> None:
    t0 = time.monotonic()
    exact = load(path, "exact", "f32")
    starts = prompts(path, n_prompts)
    seqs = [continue_greedily(exact, ids, positions) for ids in starts]
    rows = [scored_rows(s, len(p)) for s, p in zip(seqs, starts, strict=True)]
    cfg, state = reference.state_from_gguf(path)
    refs = [reference.forward(cfg, state, s)[0][r] for s, r in zip(seqs, rows, strict=True)]
    del state
    results = {}
    for m in ("exact", "int16", "int8"):
        for kv in ("f32", "f16"):
            run = runner_logits(exact if (m, kv) == ("exact", "f32") else load(path, m, kv))
            results[f"tl-serve {m}, KV {kv}"] = [run(s)[r] for s, r in zip(seqs, rows, strict=True)]
    if llamacpp.find() is not None:
        with LlamaLogits(path, n_ctx=1024, threads=2) as ll:
            results["llama.cpp (KV f16)"] = [
                ll.logits(s)[r] for s, r in zip(seqs, rows, strict=True)
            ]
    for label, got in results.items():
        kl, top1 = zip(*(kl_and_top1(a, b) for a, b in zip(refs, got, strict=True)), strict=True)
        print(f"{path.name:<34} {label:<24} {np.concatenate(kl).mean():10.3e} "
              f"{100 * np.concatenate(top1).mean():7.2f}%")  # fmt: skip
    print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)


GREEDY = Path(__file__).resolve().parents[1] / "tests" / "data" / "greedy.json"


def greedy_check() -> None:
    records = json.loads(GREEDY.read_text())["records"]
    path = resolve("bundled")
    for m in ("exact", "int16", "int8"):
        for kv in ("f32", "f16"):
            runner, kept, parted = load(path, m, kv), 0, []
            for r in records:
                want = r["output_ids_ignore_eos_48"]
                got = continue_greedily(runner, r["prompt_ids"], len(want))[len(r["prompt_ids"]) :]
                if got == want:
                    kept += 1
                else:
                    parted.append(
                        next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
                    )
            print(f"numerics {m:<5} KV {kv}: {kept} of {len(records)} continuations exact"
                  + (f"; the others part at tokens {parted}" if parted else ""), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--greedy", action="store_true", help="the greedy.json check instead")
    parser.add_argument("--models", default="bundled,Q4_K_M,Q8_0")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--positions", type=int, default=64)
    args = parser.parse_args()
    if args.greedy:
        greedy_check()
        return
    print(f"{args.prompts} prompts x {args.positions} positions, against float64 numpy")
    print(f"{'model':<34} {'engine':<24} {'mean KL':>10} {'top-1':>8}")
    for name in args.models.split(","):
        score(resolve(name), args.prompts, args.positions)


if __name__ == "__main__":
    main()

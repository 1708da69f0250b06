"""What a load run sends: prompts (synthetic, shared-prefix or from a JSONL file) and lengths."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

# Short common English words: each is about one token (with its leading space) in the usual
# BPE vocabularies, so N words make a prompt of about N tokens without a tokenizer here.
_WORD_TEXT: Final = (
    "the of and to in is was for on with as by at from his her they this that have had are "
    "not but one all were when there can an which their said if will each about how up out "
    "them then she many some so these would other into has more two time like see no way "
    "could people than first water been call who its now find long down day did get come "
    "made may part over new sound take only little work know place year live me back give "
    "most very after thing our just name good man think say great where help through much "
    "before line right too mean old any same tell boy follow came want show also around form "
    "three small set put end does another well large must big even such because turn here "
    "why ask went men read need land different home us move try kind hand picture again "
    "change off play spell air away animal house point page letter mother answer found study "
    "still learn should world high every near add food between own below country plant last "
    "school father keep tree never start city earth eye light thought head under story saw"
)
WORDS: Final = tuple(_WORD_TEXT.split())
ENDPOINTS: Final = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

Messages = list[dict[str, str]]


class LengthDist(NamedTuple):
    """A length drawn uniformly from [low, high] (low == high: fixed)."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """`128` (fixed) or `64:256` (uniform, both ends included)."""
        low, _, high = text.partition(":")
        try:
            dist = cls(int(low), int(high or low))
        except ValueError:
            dist = cls(0, 0)
        if not 1 <= dist.low <= dist.high:
            raise ValueError(f"length {text!r}: need N or LOW:HIGH with 1 <= LOW <= HIGH")
        return dist

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


def words(rng: random.Random, n: int) -> str:
    """About n tokens of text."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def read_prompts(path: Path) -> list[str | Messages]:
    """A JSONL file, one {"prompt": "..."} or {"messages": [...]} per line (blank lines skipped)."""
    items: list[str | Messages] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        doc = json.loads(line)
        if isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
            items.append(doc["prompt"])
        elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
            items.append(doc["messages"])
        else:
            raise ValueError(f'{path}:{number}: need a "prompt" string or a "messages" list')
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


@dataclass(slots=True)
class Workload:
    """Builds the request bodies of one level: the same seed gives the same bodies."""

    endpoint: str  # a key of ENDPOINTS
    input_len: LengthDist  # words of the user text (the question, in shared-prefix mode)
    output_len: LengthDist  # max_tokens
    fields: dict[str, Any]  # sent in every body: model, sampling, ignore_eos, extra fields
    shared_prefix_len: int = 0  # > 0: one shared system prompt of about this many tokens
    file_prompts: Sequence[str | Messages] = ()

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {self.endpoint!r}: one of {sorted(ENDPOINTS)}")
        if self.endpoint == "completions" and any(isinstance(p, list) for p in self.file_prompts):
            raise ValueError('"messages" prompts need the chat endpoint')

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]

    def bodies(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        system = words(random.Random(-1 - seed), self.shared_prefix_len)
        out = []
        for i in range(n):
            if self.file_prompts:
                item = self.file_prompts[i % len(self.file_prompts)]
            elif self.shared_prefix_len:
                item = [
                    {"role": "system", "content": system},
                    {
                        "role": "user",
                        "content": f"Question {i}: {words(rng, self.input_len.sample(rng))}?",
                    },
                ]
            else:
                item = words(rng, self.input_len.sample(rng))
            max_tokens = self.output_len.sample(rng)
            out.append(self.fields | self._prompt(item) | {"max_tokens": max_tokens})
        return out

    def _prompt(self, item: str | Messages) -> dict[str, Any]:
        if self.endpoint == "chat":
            messages = [{"role": "user", "content": item}] if isinstance(item, str) else item
            return {"messages": messages}
        if isinstance(item, str):
            return {"prompt": item}
        return {"prompt": "\n\n".join(m["content"] for m in item)}  # the shared-prefix pair


def stream_fields(model: str, temperature: float, ignore_eos: bool) -> dict[str, Any]:
    """The fields every benchmark request carries: streaming with a usage chunk."""
    fields: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": temperature,
    }
    if ignore_eos:  # tl-serve, vLLM and llama.cpp accept it: each reply runs to max_tokens
        fields["ignore_eos"] = True
    return fields

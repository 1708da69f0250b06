"""End of generation: which tokens end a model's turn, and which ids end one request.

Both processes apply these: the metadata reader names a model's end-of-generation ids, the
frontend writes a request's stop ids into its SamplingParams, and the core stops there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Special tokens that end a turn: llama.cpp's end-of-generation set, so a model whose metadata
# names only one of them (or the wrong one) still stops where its chat format says it does.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|im_end|>",  # ChatML: Qwen, SmolLM, Hermes
        "<|endoftext|>",
        "<|eot_id|>",  # Llama 3: end of turn
        "<|eom_id|>",  # Llama 3.1: end of a message that calls a built-in tool
        "<|end_of_text|>",
        "<end_of_turn>",  # Gemma 2 and 3
        "<turn|>",  # Gemma 4
        "<|tool_response>",  # Gemma 4: a tool call is written, its answer comes from outside
        "<|end|>",  # Phi-3
    }
)


def end_of_generation_ids(named: Iterable[int], specials: Mapping[int, str]) -> list[int]:
    """The ids the metadata names, plus every special token (id -> text) that ends a turn."""
    eog = set(named)
    eog.update(i for i, text in specials.items() if text in END_OF_GENERATION_TEXTS)
    return sorted(eog)


def stop_token_ids(eos_ids: Iterable[int], own: Iterable[int], ignore_eos: bool) -> tuple[int, ...]:
    """The ids that end one request: the model's EOS ids unless ignore_eos, then its own."""
    eos = () if ignore_eos else tuple(eos_ids)
    return eos + tuple(i for i in own if i not in eos)

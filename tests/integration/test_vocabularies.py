"""The real vocabularies of the model families (llama.cpp's ggml-vocab-*.gguf) served by a
frontend: every .inp/.out case through /v1/tokenize, the BOS each adds, the tokens that end
its turns; and the family's real chat template with its real special tokens: rendered as
transformers renders it, tokenized with a single BOS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frontend.text import chat_template as chat_template_module
from frontend.text.chat_template import ChatTemplate
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import TokenizerMetadata, read_tokenizer_metadata
from tests.conftest import require_llama_cpp_data
from tests.fixtures.frontend_harness import serving
from tests.fixtures.hf_chat_template import NOW, FixedClock, hf_render
from tests.fixtures.llama_cpp_data import TEMPLATES, VOCABS, vocab_cases, vocab_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# per vocabulary: the BOS that add_special_tokens puts first (None: none), every token that
# ends generation, and the number of .inp/.out cases
FACTS: dict[str, tuple[int | None, list[int], int]] = {
    "llama-bpe": (128000, [128001, 128009], 46),  # <|end_of_text|>, <|eot_id|>
    "qwen2": (None, [151643, 151645], 46),  # <|endoftext|>, <|im_end|>
    "qwen35": (None, [151643, 151645], 50),
    "gpt-2": (None, [50256], 46),
    "llama-spm": (1, [2], 46),
    "phi-3": (1, [32000, 32007], 46),  # <|endoftext|>, <|end|>
    "gemma-4": (2, [1, 50, 106], 46),  # <eos>, <|tool_response>, <turn|>
}
# the chat template of a model with this vocabulary (llama.cpp's models/templates)
TEMPLATE_OF = {
    "llama-bpe": "meta-llama-Llama-3.2-3B-Instruct.jinja",  # writes BOS
    "qwen2": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "qwen35": "Qwen3.5-4B.jinja",
    "phi-3": "microsoft-Phi-3.5-mini-instruct.jinja",  # no BOS (transformers adds none either)
    "gemma-4": "google-gemma-4-31B-it.jinja",  # writes BOS
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Bye"},
]


async def tokenize(api: str, body: dict[str, Any]) -> list[int]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(api + "/v1/tokenize", json={"model": "succ"} | body) as r,
    ):
        assert r.status == 200, await r.text()
        doc = await r.json()
        tokens: list[int] = doc["tokens"]
        assert doc["count"] == len(tokens)
        return tokens


def test_facts_cover_every_vocabulary() -> None:
    assert sorted(FACTS) == sorted(VOCABS)
    assert set(TEMPLATE_OF) <= set(VOCABS)


def check_family_template(name: str, metadata: TokenizerMetadata, bos: int | None) -> None:
    """The family's template with the vocabulary's own BOS and EOS text: rendered as
    transformers renders it; its prompt holds the BOS it writes once, encoding adds none."""
    text = (TEMPLATES / TEMPLATE_OF[name]).read_text(encoding="utf-8")
    template = ChatTemplate(text, metadata.bos_token, metadata.eos_token)
    rendered = template.render(CONVERSATION, add_generation_prompt=True)
    specials = {"bos_token": metadata.bos_token, "eos_token": metadata.eos_token}
    assert rendered == hf_render(text, CONVERSATION, True, strftime_now=NOW.strftime, **specials)
    tokenizer = Tokenizer(metadata)
    chat = tokenizer.encode(rendered)  # what /v1/chat/completions sends
    assert bos is None or chat.count(bos) == rendered.count(metadata.bos_token)
    with_specials = tokenizer.encode(rendered, add_special_tokens=True)
    assert bos is None or (with_specials[0] == bos and with_specials.count(bos) == 1)
    if not metadata.add_space_prefix:  # (a SentencePiece space prefix is text of its own)
        assert tokenizer.decode(chat) == rendered


@pytest.mark.parametrize("name", VOCABS)
async def test_vocabulary_through_v1_tokenize(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    require_llama_cpp_data()
    monkeypatch.setattr(chat_template_module, "datetime", FixedClock)
    bos, eos_ids, num_cases = FACTS[name]
    metadata = read_tokenizer_metadata(vocab_path(name))  # parsed once: the server reuses it
    assert metadata.eos_ids == eos_ids
    cases = vocab_cases(name)
    assert len(cases) == num_cases
    async with serving(vocab_path(name)) as s:
        wrong = []
        for text, ids in cases:
            # llama.cpp's cases: no special tokens added
            got = await tokenize(s.api, {"prompt": text, "add_special_tokens": False})
            if got != ids:
                wrong.append((text, got, ids))
        assert wrong == []
        text, ids = cases[11]
        assert text == "Hello world"
        with_bos = await tokenize(s.api, {"prompt": text})  # add_special_tokens by default
        assert with_bos == ids if bos is None else [bos, *ids]
        if metadata.chat_template is not None:
            # the template writes what it wants; a BOS it writes is not doubled
            messages = [{"role": "user", "content": "Hello world"}]
            chat = await tokenize(s.api, {"messages": messages, "add_special_tokens": True})
            assert chat.count(bos) <= 1 if bos is not None else True
            if bos is not None and metadata.chat_template.startswith("{{ bos_token }}"):
                assert chat[0] == bos
    if name in TEMPLATE_OF:
        check_family_template(name, metadata, bos)


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2"])
def test_the_same_tokenizer_from_a_tokenizer_json(name: str, tmp_path: Path) -> None:
    """A Hugging Face directory with this vocabulary as tokenizer.json (SentencePiece style and
    byte-level): the same ids, BOS rule and token bytes as the GGUF."""
    require_llama_cpp_data()
    gguf_metadata = read_tokenizer_metadata(vocab_path(name))
    from_gguf = Tokenizer(gguf_metadata)
    (tmp_path / "tokenizer.json").write_text(from_gguf.hf.to_str())
    config = {
        "bos_token": gguf_metadata.bos_token,
        "eos_token": gguf_metadata.eos_token,
        "add_bos_token": gguf_metadata.add_bos,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    metadata = read_tokenizer_metadata(tmp_path)
    assert metadata.byte_level == gguf_metadata.byte_level
    tokenizer = Tokenizer(metadata)
    for text, ids in vocab_cases(name):
        assert tokenizer.encode(text) == ids
        assert tokenizer.encode(text, True) == from_gguf.encode(text, True)
    assert tokenizer.vocabulary() == from_gguf.vocabulary()

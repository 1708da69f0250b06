"""Fixtures of the unit tests of structured outputs and tools: the tiny model's llguidance
vocabulary and the frontend's grammar checker over it, and a chat request from fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frontend.openai.requests import ChatCompletionRequest, decode_request
from frontend.openai.structured import GrammarChecker
from tests.conftest import TinyModels
from tests.fixtures.grammars import Vocabulary


@pytest.fixture(scope="module")
def vocab(tiny: TinyModels) -> Vocabulary:
    return Vocabulary.of(tiny.hf)


@pytest.fixture(scope="module")
def checker(vocab: Vocabulary) -> GrammarChecker:
    return GrammarChecker(vocab.tokenizer)


def chat(**fields: Any) -> ChatCompletionRequest:
    doc = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    return decode_request(json.dumps(doc).encode(), ChatCompletionRequest)

"""A BF16 Hugging Face checkpoint serves: the tiny Gemma 3 of tests/data/arch (the Hub's usual
dtype, the architecture most unlike llama) behind a real frontend and engine core continues
its prompts as transformers' greedy generate does."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.fixtures.byte_tokenizer import byte_tokenizer_json
from tests.fixtures.live_server import default_engine, live_server, post

pytestmark = pytest.mark.integration

ARCH = Path(__file__).resolve().parents[1] / "data" / "arch"


async def test_bf16_gemma3_serves_transformers_greedy_continuations(tmp_path: Path) -> None:
    model = tmp_path / "gemma3"
    shutil.copytree(ARCH / "gemma3", model)
    # a byte vocabulary as large as the model's: bytes, then special tokens
    specials = [f"<|special_{i}|>" for i in range(320 - 256)]
    tokenizer_json = byte_tokenizer_json(specials)
    (model / "tokenizer.json").write_text(tokenizer_json)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    data = np.load(model / "logits.npz")
    engine = default_engine(model, model_id="gemma3", max_model_len=128)
    with live_server(tmp_path / "server", engine) as server:
        for i in (1, 2):  # continuations of bytes only (the other one is special tokens)
            want = data[f"greedy_{i}"].tolist()
            body = {"model": "gemma3", "prompt": data[f"prompt_{i}"].tolist(),
                    "max_tokens": len(want), "temperature": 0}  # fmt: skip
            reply = await post(server.api + "/v1/completions", body)
            assert reply.status == 200, reply.body
            assert reply.doc["usage"]["completion_tokens"] == len(want)
            assert reply.doc["choices"][0]["text"] == tokenizer.decode(want)

"""bench.llama_logits' pipe protocol, against a stand-in for the compiled llama-logits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bench.llama_logits import LlamaLogits, greedy

# speaks llama-logits' protocol: n_vocab, then per request n * n_vocab float32;
# row i puts 1.0 on token (ids[i] + 1) % n_vocab and the position on the last column
FAKE = """
import sys
import numpy as np
model, n_ctx, threads = sys.argv[1:]
if model.endswith("missing.gguf"):
    sys.exit(1)
n_vocab = 7
out, inp = sys.stdout.buffer, sys.stdin.buffer
out.write(np.int32(n_vocab).tobytes()); out.flush()
while (head := inp.read(4)):
    n = int(np.frombuffer(head, np.int32)[0])
    ids = np.frombuffer(inp.read(4 * n), np.int32)
    rows = np.zeros((n, n_vocab), np.float32)
    rows[np.arange(n), (ids + 1) % n_vocab] = 1.0
    rows[:, -1] = np.arange(n) * 0.01
    out.write(rows.tobytes()); out.flush()
"""


@pytest.fixture
def fake(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_llama_logits.py"
    script.write_text(FAKE)
    return [sys.executable, str(script)]


def test_logits_come_back_row_per_position(fake: list[str]) -> None:
    with LlamaLogits(Path("m.gguf"), n_ctx=16, argv=fake) as llama:
        assert llama.n_vocab == 7
        rows = llama.logits([0, 3, 4])
        again = llama.logits([4])
    assert rows.shape == (3, 7) and rows.dtype == np.float32
    assert rows[:, :-1].argmax(axis=1).tolist() == [1, 4, 5]
    assert rows[:, -1].tolist() == pytest.approx([0.0, 0.01, 0.02])
    assert again.shape == (1, 7) and again[0, :-1].argmax() == 5


def test_greedy_feeds_each_argmax_back(fake: list[str]) -> None:
    with LlamaLogits(Path("m.gguf"), n_ctx=16, argv=fake) as llama:
        assert greedy(llama, [0], 4) == [1, 2, 3, 4]


def test_sequence_length_is_checked_before_sending(fake: list[str]) -> None:
    with LlamaLogits(Path("m.gguf"), n_ctx=4, argv=fake) as llama:
        with pytest.raises(ValueError, match=r"1\.\.4 tokens, not 5"):
            llama.logits([1, 2, 3, 4, 5])
        with pytest.raises(ValueError, match="not 0"):
            llama.logits([])
        assert llama.logits([1, 2, 3, 4]).shape == (4, 7)  # still usable


def test_a_model_that_does_not_load_is_an_error(fake: list[str]) -> None:
    with pytest.raises(RuntimeError, match="could not load"):
        LlamaLogits(Path("missing.gguf"), argv=fake).__enter__()

"""llama.cpp's next-token logits (float32, whole vocabulary) at every position, for fidelity runs.

    from bench.llama_logits import LlamaLogits
    with LlamaLogits(Path("model.gguf")) as llama:
        rows = llama.logits([1, 504, 3458])   # (3, n_vocab) float32; row i follows token i

A child process, `llama-logits` (bench/llama_logits.c, compiled on first use against the libllama
of `python -m bench.llamacpp build`), loads the GGUF once and answers sequence after sequence
over pipes; each sequence is evaluated alone from an empty KV cache, in one llama_decode call,
with llama.cpp's default context settings (f16 KV cache, flash attention on auto).

    .venv/bin/python -m bench.llama_logits [--model NAME] [--prompt TEXT] [--tokens 16]

checks it: the greedy continuation of a prompt (plain text, no chat template) and whether a
second evaluation of the same ids gives identical logits.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import numpy as np

from bench import llamacpp

SOURCE = Path(__file__).with_name("llama_logits.c")


def compile_tool(build: llamacpp.Build) -> Path:
    """bin/llama-logits of `build`, (re)compiled when missing or built from another source."""
    exe = build.bin("llama-logits")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    stamp = exe.with_name("llama-logits.sha256")
    if exe.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return exe
    cc = shutil.which("cc") or "gcc"
    tmp = exe.with_name(f"llama-logits.{os.getpid()}")
    argv = [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-I", str(build.root / "include"),
            str(SOURCE), "-o", str(tmp), "-L", str(build.lib), "-lllama",
            "-Wl,-rpath,$ORIGIN/../lib"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot compile {SOURCE.name}: {done.stderr.strip()}")
    tmp.replace(exe)
    stamp.write_text(digest + "\n")
    return exe


def read_exact(stream: IO[bytes] | None, size: int) -> bytes:
    """Exactly `size` bytes from a binary pipe; raises when it ends first."""
    assert stream is not None
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError(f"the logits process closed its output ({size - left} of {size} bytes)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class LlamaLogits:
    """A running `llama-logits` on one GGUF: started on enter, stopped on exit."""

    def __init__(
        self,
        model: Path,
        *,
        n_ctx: int = 1024,
        threads: int = 2,
        argv: Sequence[str] | None = None,
    ) -> None:
        """`argv` replaces the command (tests); by default the tool of the llama.cpp build."""
        self.model = model
        self.n_ctx = n_ctx
        self.threads = threads
        self.argv = list(argv) if argv is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.n_vocab = 0

    def __enter__(self) -> LlamaLogits:
        argv = self.argv
        if argv is None:
            build = llamacpp.find()
            if build is None:
                raise RuntimeError(f"no llama.cpp build: {llamacpp.how_to_build()}")
            argv = [str(compile_tool(build))]
        argv = [*argv, str(self.model), str(self.n_ctx), str(self.threads)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            self.n_vocab = int(np.frombuffer(read_exact(self.proc.stdout, 4), np.int32)[0])
        except EOFError:
            self.__exit__(None, None, None)
            raise RuntimeError(f"llama-logits could not load {self.model}") from None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """(len(ids), n_vocab) float32: row i is the next-token logits after ids[: i + 1]."""
        if not 1 <= len(ids) <= self.n_ctx:
            raise ValueError(f"a sequence holds 1..{self.n_ctx} tokens, not {len(ids)}")
        assert self.proc is not None and self.proc.stdin is not None, "use it as a context manager"
        request = np.asarray([len(ids), *ids], np.int32)
        self.proc.stdin.write(request.tobytes())
        self.proc.stdin.flush()
        raw = read_exact(self.proc.stdout, len(ids) * self.n_vocab * 4)
        return np.frombuffer(raw, np.float32).reshape(len(ids), self.n_vocab).copy()


def greedy(llama: LlamaLogits, ids: list[int], steps: int) -> list[int]:
    """`steps` argmax tokens after `ids`, each from a whole re-evaluation."""
    out = list(ids)
    for _ in range(steps):
        out.append(int(np.argmax(llama.logits(out)[-1])))
    return out[len(ids) :]


def main(argv: list[str] | None = None) -> int:
    from bench.models import resolve
    from shared.tokenizer import Tokenizer
    from shared.tokenizer_metadata import read_tokenizer_metadata

    p = argparse.ArgumentParser(
        prog="python -m bench.llama_logits", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default="bundled", help="a bench.models name or a GGUF path")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args(argv)
    path = resolve(args.model)
    tok = Tokenizer(read_tokenizer_metadata(path))
    ids = tok.encode(args.prompt)
    with LlamaLogits(path) as llama:
        first, second = llama.logits(ids), llama.logits(ids)
        cont = greedy(llama, ids, args.tokens)
    print(f"{path.name}: {len(ids)} prompt tokens, n_vocab {llama.n_vocab}")
    print(f"greedy continuation: {args.prompt!r} -> {tok.decode(cont)!r}")
    print(f"second evaluation identical: {np.array_equal(first, second)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bench models: the bundled GGUF's re-quantizations and random-weight models of larger shapes.

    flock /tmp/tl-heavy.lock .venv/bin/python -m bench.models     # ~5 min the first time, then instant

Writes into ~/.cache/tl-serve/bench-models/ (a file already there is kept):

- the bundled SmolLM2-135M-Instruct Q4_1 re-quantized by llama.cpp's `llama-quantize
  --allow-requantize` to Q4_K_M, Q8_0, Q4_0, Q5_K_M and Q6_K (their values start from Q4_1's);
- random-weight models of SmolLM2-360M's and SmolLM2-1.7B's shapes, with the bundled model's
  tokenizer and chat template (vocab 49152, tied embeddings like the originals): written as F16
  with the `gguf` package (matrices normal with std 0.02, norms 1), then quantized by
  `llama-quantize` to Q4_1 and Q4_K_M (llama.cpp's own mixes: a Q4_1 file of these shapes
  holds other types too, e.g. a Q6_K token embedding) and to Q4_1 with `--pure` (Q4_1 only).

Needs `python -m bench.llamacpp build` for llama-quantize. `--model NAME` elsewhere in bench/
accepts the names `list` prints.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np

from bench import llamacpp
from shared.config import BUNDLED_MODEL

DIR = Path("~/.cache/tl-serve/bench-models").expanduser()
BUNDLED = Path(BUNDLED_MODEL).expanduser()
REQUANTS = ("Q4_K_M", "Q8_0", "Q4_0", "Q5_K_M", "Q6_K")
# "-pure": llama-quantize --pure, every matrix in the one type (the default mixes keep the token
# embedding of these shapes in Q6_K or Q8_0)
RANDOM_QUANTS = ("Q4_1", "Q4_K_M", "Q4_1-pure")
WEIGHT_STD = 0.02


class Shape(NamedTuple):
    """A Llama-architecture shape (head dim 64, SmolLM2's hyper-parameters otherwise)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_base: float


SHAPES = (
    Shape("360M", 960, 32, 15, 5, 2560, 100_000.0),
    Shape("1.7B", 2048, 24, 32, 32, 8192, 130_000.0),
)


def requant_path(qtype: str) -> Path:
    return DIR / f"{BUNDLED.name.split('.')[0]}.{qtype}.gguf"


def random_path(shape: Shape, qtype: str) -> Path:
    return DIR / f"SmolLM2-{shape.name}-shape.random.{qtype}.gguf"


def catalogue() -> dict[str, Path]:
    """Every bench model by the name `--model` accepts: 'bundled', 'Q4_K_M', '360M', '1.7B-Q4_K_M'..."""
    names = {"bundled": BUNDLED} | {q: requant_path(q) for q in REQUANTS}
    for shape in SHAPES:
        names[shape.name] = random_path(shape, RANDOM_QUANTS[0])
        names |= {f"{shape.name}-{q}": random_path(shape, q) for q in ("F16", *RANDOM_QUANTS[1:])}
    return names


def resolve(name_or_path: str) -> Path:
    """A catalogue name or a path to a GGUF; exits with the list of names when it is neither."""
    names = catalogue()
    path = names.get(name_or_path, Path(name_or_path).expanduser())
    if not path.exists():
        hint = "python -m bench.models" if name_or_path in names else "a path or one of: "
        sys.exit(f"no model {name_or_path!r} ({path}); {hint}{', '.join(names)}")
    return path


def tensors(shape: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """GGUF tensor names and numpy shapes (out, in) of a Llama model with tied embeddings."""
    d, head_dim = shape.hidden, shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    yield "token_embd.weight", (vocab, d)
    for i in range(shape.layers):
        yield f"blk.{i}.attn_norm.weight", (d,)
        yield f"blk.{i}.attn_q.weight", (d, d)
        yield f"blk.{i}.attn_k.weight", (kv, d)
        yield f"blk.{i}.attn_v.weight", (kv, d)
        yield f"blk.{i}.attn_output.weight", (d, d)
        yield f"blk.{i}.ffn_norm.weight", (d,)
        yield f"blk.{i}.ffn_gate.weight", (shape.ffn, d)
        yield f"blk.{i}.ffn_up.weight", (shape.ffn, d)
        yield f"blk.{i}.ffn_down.weight", (d, shape.ffn)
    yield "output_norm.weight", (d,)


def weight(index: int, dims: tuple[int, ...]) -> np.ndarray:
    """Norms are ones (F32); matrices normal with std WEIGHT_STD (F16), seeded by position."""
    if len(dims) == 1:
        return np.ones(dims, np.float32)
    rng = np.random.default_rng([20261201, index])
    w = rng.standard_normal(dims, dtype=np.float32)  # (out, in)
    w *= WEIGHT_STD
    return w.astype(np.float16)


def write_random(shape: Shape, out: Path, tokenizer_from: Path) -> None:
    """An F16 GGUF of `shape` with random weights and the tokenizer fields of `tokenizer_from`."""
    src = gguf.GGUFReader(tokenizer_from)
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"SmolLM2-{shape.name} shape, random weights")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(shape.layers)
    w.add_context_length(8192)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    for key, field in src.fields.items():  # tokenizer and chat template, verbatim
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub)
    specs = list(tensors(shape, vocab))
    for name, dims in specs:
        dtype = np.float32 if len(dims) == 1 else np.float16
        w.add_tensor_info(
            name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (_name, dims) in enumerate(specs):  # one tensor in memory at a time
        w.write_tensor_data(weight(i, dims))
    w.close()


def quantize(src: Path, out: Path, qtype: str, build: llamacpp.Build) -> None:
    """llama-quantize on 2 threads; a `-pure` suffix of `qtype` adds --pure."""
    qtype, _, mode = qtype.partition("-")
    pure = ["--pure"] if mode == "pure" else []
    argv = [
        str(build.bin("llama-quantize")),
        "--allow-requantize",
        *pure,
        str(src),
        str(out),
        qtype,
        "2",
    ]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        out.unlink(missing_ok=True)
        sys.exit(f"llama-quantize failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def ensure(out: Path, make: Callable[[Path], None]) -> None:
    """Run `make(tmp)` unless `out` exists; the file appears under its name only when complete."""
    if out.exists():
        return
    tmp = out.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    make(tmp)
    tmp.rename(out)


def write_all(build: llamacpp.Build) -> None:
    DIR.mkdir(parents=True, exist_ok=True)
    for q in REQUANTS:
        ensure(requant_path(q), partial(quantize, BUNDLED, qtype=q, build=build))
    for shape in SHAPES:
        f16 = random_path(shape, "F16")
        ensure(f16, partial(write_random, shape, tokenizer_from=BUNDLED))
        for q in RANDOM_QUANTS:
            ensure(random_path(shape, q), partial(quantize, f16, qtype=q, build=build))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.split("\n")[0])
    p.add_argument("command", nargs="?", choices=("write", "list"), default="write")
    args = p.parse_args(argv)
    if args.command == "write":
        build = llamacpp.find()
        if build is None:
            sys.exit(f"llama-quantize is needed: {llamacpp.how_to_build()}")
        write_all(build)
    for name, path in catalogue().items():
        size = f"{path.stat().st_size / 2**20:9.1f} MiB" if path.exists() else "  missing    "
        print(f"{name:<14} {size}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""load(path) -> (ModelConfig, Weights): a .gguf file or a Hugging Face-style directory."""

from __future__ import annotations

from pathlib import Path

from enginecore.loader import gguf, safetensors
from enginecore.model import ModelConfig
from enginecore.weights import Numerics, Weights


def load(path: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    if path.is_file() and path.suffix == ".gguf":
        return gguf.load(path, numerics)
    if path.is_dir():
        return safetensors.load(path, numerics)
    raise ValueError(f"model_dir {path} is neither a .gguf file nor a model directory")

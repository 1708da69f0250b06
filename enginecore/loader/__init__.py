"""load(path) -> (ModelConfig, Weights): a .gguf file or a Hugging Face-style directory."""

from __future__ import annotations

from pathlib import Path

from enginecore.loader import gguf, safetensors
from enginecore.model import ModelConfig
from enginecore.weights import Numerics, Weights


def load(path: Path, numerics: Numerics) -> tuple[ModelConfig, Weights]:
    """The model at `path`; ValueError (naming what is wrong where it can) if it is not one."""
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise ValueError(f"model_dir {path} is neither a .gguf file nor a model directory")
    try:
        return safetensors.load(path, numerics) if path.is_dir() else gguf.load(path, numerics)
    except ValueError:
        raise
    except (ArithmeticError, LookupError, TypeError, AssertionError) as e:
        # a file the specific checks let through but the loader cannot use: still a refusal
        raise ValueError(f"{path}: malformed model ({type(e).__name__}: {e})") from e

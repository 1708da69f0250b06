"""Import rules: which package, and which room of the frontend, may import what; checked on the
source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY_OF = {
    # gguf: shared/gguf_file.py opens GGUF files for both sides; tokenizers:
    # shared/tokenizer.py builds the one tokenizer both sides can use
    # llguidance: shared/grammar.py builds and checks grammars for both sides
    "shared": {"msgspec", "gguf", "tokenizers", "llguidance"},
    "frontend": {"msgspec", "aiohttp", "zmq", "minijinja", "prometheus_client"},
    "enginecore": {
        "msgspec",
        "numpy",
        "numba",
        "llvmlite",
        "zmq",
        "gguf",
        "safetensors",
        "llguidance",
        "ml_dtypes",
    },
}
FIRST_PARTY = {"shared", "frontend", "enginecore"}
MAY_IMPORT = {
    "shared": {"shared"},
    "frontend": {"shared", "frontend"},
    "enginecore": {"shared", "enginecore"},
}
# The frontend's rooms and the rooms each may import (besides shared). The process entry
# points at the top (__main__, server, workers) may import every room; no room imports them.
ROOMS_OF = {
    "frontend/text/": {"frontend.text"},
    "frontend/core/": {"frontend.core"},
    "frontend/openai/": {"frontend.openai", "frontend.text"},
    "frontend/api/": {"frontend.api", "frontend.openai", "frontend.text", "frontend.core"},
}
# the only modules that may use these
ONLY_IN = {
    "numba": ("enginecore/kernels/",),
    "llvmlite": ("enginecore/kernels/",),
    "zmq": ("enginecore/channel.py", "frontend/core/"),
    "gguf": ("shared/gguf_file.py", "enginecore/loader/"),
    "safetensors": ("enginecore/loader/",),
    "ml_dtypes": ("enginecore/loader/",),  # numpy's bfloat16, for BF16 safetensors
    "tokenizers": ("shared/tokenizer.py",),
    "llguidance": ("shared/grammar.py", "enginecore/grammar.py"),
    "minijinja": ("frontend/text/",),
    "prometheus_client": ("frontend/api/",),
    "aiohttp": ("frontend/api/", "frontend/server.py", "frontend/workers.py"),
}
KERNELS_MAY_IMPORT = {"numpy", "numba", "llvmlite"}  # and the standard library, and each other


def modules(path: Path) -> set[str]:
    """Every absolute module name the file imports."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def imports(path: Path) -> set[str]:
    return {m.split(".")[0] for m in modules(path)}


def stdlib(name: str) -> bool:
    import sys

    return name in sys.stdlib_module_names or name == "__future__"


def room(rel: str) -> str | None:
    """The frontend room a source file is in, None for the entry points and other packages."""
    return next((r for r in ROOMS_OF if rel.startswith(r)), None)


SOURCES = sorted(p for pkg in FIRST_PARTY for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layering(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    pkg = rel.split("/")[0]
    for name in imports(path):
        if stdlib(name):
            continue
        if name in FIRST_PARTY:
            assert name in MAY_IMPORT[pkg], f"{rel} imports {name}"
            continue
        assert name in THIRD_PARTY_OF[pkg], f"{rel} imports {name}, not allowed in {pkg}/"
        if name in ONLY_IN:
            assert rel.startswith(ONLY_IN[name]), f"{rel} imports {name}: only {ONLY_IN[name]} may"
    if rel.startswith("enginecore/kernels/"):
        extra = {
            m for m in modules(path)
            if not stdlib(m.split(".")[0]) and not m.startswith("enginecore.kernels")
            and m.split(".")[0] not in KERNELS_MAY_IMPORT
        }  # fmt: skip
        assert not extra, f"{rel} imports {extra}"


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if room(str(p.relative_to(ROOT)))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_frontend_rooms_import_only_the_rooms_below_them(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    allowed = ROOMS_OF[room(rel) or ""]
    for name in modules(path):
        if name.split(".")[0] == "frontend":
            assert ".".join(name.split(".")[:2]) in allowed, f"{rel} imports {name}"

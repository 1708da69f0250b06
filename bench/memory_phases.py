"""Where a core's resident memory goes: RSS after each phase of its start-up, in one process.

`python -m bench.memory --phases` runs this in a fresh process per model (so that nothing of the
bench itself is counted): `python -m bench.memory_phases PATH TOKENS KV_DTYPE NUMERICS`.

It runs the core's own start-up (`enginecore.__main__.build`) with its steps wrapped, printing
VmRSS (and its anonymous and file-backed parts, and the peak) after the imports, the tokenizer
metadata, the weights, the KV cache, the rest of the model runner (RoPE tables, stacked layers),
the warm-up (numba kernels loaded from the on-disk cache and run), the grammar compiler and the
engine; then the resident memory by kind of mapping (/proc/self/smaps) and the numba kernels
that were compiled instead of loaded from the cache (each compile keeps LLVM's memory).
Imports are measured before anything else is imported, so this module imports only the
standard library at the top.
"""

from __future__ import annotations

import inspect
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

MB = 1 << 20


def status_mb() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process in MB."""
    text = Path("/proc/self/status").read_text()
    fields = re.findall(r"^(VmRSS|RssAnon|RssFile|VmHWM):\s+(\d+) kB", text, re.M)
    return {k: int(v) * 1024 / MB for k, v in fields}


class Phases:
    """Prints one line per phase: RSS, its growth, anonymous and file-backed parts, peak."""

    def __init__(self) -> None:
        self.last = 0.0

    def mark(self, name: str) -> None:
        s = status_mb()
        print(f"  {name:34s} RSS {s['VmRSS']:7.0f}  {s['VmRSS'] - self.last:+7.0f}   "
              f"anon {s['RssAnon']:7.0f}   file {s['RssFile']:5.0f}   peak {s['VmHWM']:7.0f}",
              flush=True)  # fmt: skip
        self.last = s["VmRSS"]

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Mark `label` after each call of owner.name (a module's function, a method)."""
        fn: Callable[..., Any] = getattr(owner, name)

        def marked(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            self.mark(label)
            return result

        static = isinstance(inspect.getattr_static(owner, name), staticmethod)
        setattr(owner, name, staticmethod(marked) if static else marked)


def smaps_mb() -> tuple[Counter[str], Counter[str]]:
    """Resident MB by kind of mapping ([heap], anonymous mmap, file-backed) and by file."""
    kinds: Counter[str] = Counter()
    files: Counter[str] = Counter()
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$", line)
        if head:
            name = head.group(1)
        elif line.startswith("Rss:"):
            mb = int(line.split()[1]) * 1024 / MB
            if name.startswith("/"):
                kinds["file-backed (code, data of libraries)"] += mb
                files[Path(name).name] += mb
            elif name == "[heap]":
                kinds["[heap] (malloc below its mmap threshold)"] += mb
            elif not name:
                kinds["anonymous mmap (large arrays, arenas)"] += mb
            else:
                kinds[name] += mb
    return kinds, files


def main() -> None:
    path, tokens, kv, numerics = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    phases = Phases()
    phases.mark("python")
    import numpy  # noqa: F401

    phases.mark("import numpy")
    import numba  # noqa: F401

    phases.mark("import numba")
    import enginecore.__main__ as core
    from enginecore import loader, model_runner
    from enginecore.channel import Channel
    from shared.config import EngineConfig

    phases.mark("import the core")
    phases.wrap(core, "read_tokenizer_metadata", "tokenizer metadata")
    phases.wrap(loader, "load", "weights")
    phases.wrap(model_runner.KVCache, "allocate", "KV cache")
    phases.wrap(model_runner, "stack_layers", "RoPE tables, stacked layers")
    phases.wrap(model_runner.ModelRunner, "warmup", "warm-up (numba kernels)")
    phases.wrap(core, "grammar_compiler", "grammar compiler")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = EngineConfig(
            model_dir=str(path), num_kv_blocks=tokens // EngineConfig().block_size,
            max_model_len=tokens, kv_cache_dtype=kv, numerics=numerics,  # type: ignore[arg-type]
        )  # fmt: skip
        channel = Channel(f"ipc://{tmp}/core.sock")
        engine = core.build(cfg, channel)
        phases.mark("engine (serving)")
        kinds, files = smaps_mb()
        for kind, mb in kinds.most_common():
            if mb >= 1:
                print(f"    {mb:7.0f}  {kind}")
        print("    largest files: " + ", ".join(f"{n} {mb:.0f}" for n, mb in files.most_common(4)))
        compiled = sorted(
            f"{d.py_func.__module__}.{d.py_func.__name__}"
            for d in _dispatchers()
            if sum(d.stats.cache_misses.values())
        )
        print(f"    kernels compiled in this process (not from the cache): {compiled or 'none'}")
        channel.close()
        del engine


def _dispatchers() -> list[Any]:
    import gc

    from numba.core.registry import CPUDispatcher

    return [o for o in gc.get_objects() if isinstance(o, CPUDispatcher)]


if __name__ == "__main__":
    main()

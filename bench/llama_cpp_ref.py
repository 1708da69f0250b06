"""llama.cpp on the same GGUF, through llama-cpp-python: prompt eval and batch-1 decode tok/s.

Run by bench/model.py with a Python that has `llama_cpp` (it may live in another venv):
    python bench/llama_cpp_ref.py MODEL.gguf REPEAT   -> one JSON line
Standard library + llama_cpp only, so any interpreter with llama-cpp-python can run it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable


def best(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(path: str, repeat: int) -> None:
    import llama_cpp  # type: ignore[import-not-found]

    llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=2, n_batch=512, verbose=False)
    prompt = [(i * 13) % 40000 + 100 for i in range(512)]

    def prompt_eval() -> None:
        llm.reset()
        llm.eval(prompt)

    pe = best(prompt_eval, repeat)
    llm.reset()
    llm.eval(prompt[:150])

    def decode64() -> None:
        for i in range(64):
            llm.eval([prompt[i]])

    dec = best(decode64, max(1, repeat // 2))
    version = getattr(llama_cpp, "__version__", "?")
    print(json.dumps({"version": version, "prompt_eval_tok_s": 512 / pe, "decode_tok_s": 64 / dec}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

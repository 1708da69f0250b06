"""Resident memory of a serving engine core beside llama-server's, same GGUF, same KV capacity.

`python -m bench.memory [--models bundled,1.7B] [--tokens 4096] [--phases]`

Starts `python -m enginecore` with a KV cache of exactly `tokens` tokens (f32 and f16) and
waits for it to serve (weights loaded, kernels warmed up), then reads VmRSS and VmHWM from
/proc; then llama-server (`-c tokens -np 1 -t 2`, its default f16 KV cache) the same way once
/health answers. Prints both, the weights' bytes as the core reports them beside the file
size, and the KV bytes, so that RSS = base + weights + KV can be read off.

`--phases` instead runs the core's start-up in one fresh process per model (bench/memory_phases.py)
and prints its RSS after each phase (imports, tokenizer metadata, weights, KV cache, warm-up,
grammar compiler), then the resident memory by kind of mapping: where the base goes.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import llamacpp
from bench.models import resolve
from shared.config import EngineConfig

BLOCK = EngineConfig().block_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def core_rss(path: Path, tokens: int, kv: str, numerics: str) -> tuple[float, float, float, float]:
    """(RSS, peak RSS, weight MB, warm-up seconds) of a serving core. A warm-up of tens of
    seconds compiled kernels in the core's own process (a cold numba cache), whose LLVM memory
    then stays: that RSS is not the serving one."""
    with tempfile.TemporaryDirectory() as tmp:
        toml = Path(tmp) / "runtime.toml"
        toml.write_text(
            f'[engine]\nmodel_dir = "{path}"\nnum_kv_blocks = {tokens // BLOCK}\n'
            f'kv_cache_dtype = "{kv}"\nnumerics = "{numerics}"\nmax_model_len = {tokens}\n'
            f'core_address = "ipc://{tmp}/core.sock"\n'
        )
        log = Path(tmp) / "core.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "enginecore", "--config", str(toml)], stdout=out, stderr=out
            )
        try:
            while "serving " not in log.read_text():
                if proc.poll() is not None:
                    raise RuntimeError(f"the core exited: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            time.sleep(1.0)
            rss, peak = rss_mb(proc.pid)
        finally:
            stop(proc)
        text = log.read_text()
        weights = re.search(r"([\d.]+) MB of weights", text)
        warmup = re.search(r"warmup done in ([\d.]+) s", text)
        return (
            rss, peak, float(weights.group(1)) if weights else float("nan"),
            float(warmup.group(1)) if warmup else float("nan"),
        )  # fmt: skip


def llama_server_rss(path: Path, tokens: int) -> tuple[float, float]:
    build = llamacpp.find()
    if build is None:
        raise RuntimeError(llamacpp.how_to_build())
    port = free_port()
    argv = [str(build.bin("llama-server")), "-m", str(path), "-c", str(tokens), "-np", "1",
            "-t", "2", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        time.sleep(1.0)
        return rss_mb(proc.pid)
    finally:
        stop(proc)


def kv_mb(path: Path, tokens: int, itemsize: int) -> float:
    from enginecore.loader.gguf import read_config
    from shared.gguf_file import gguf_reader

    cfg = read_config(gguf_reader(path))
    return 2 * cfg.num_layers * cfg.kv_dim * itemsize * tokens / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="bundled,1.7B")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--numerics", default=EngineConfig().numerics)
    parser.add_argument("--kv", default="f16", help="KV cache dtype of --phases")
    parser.add_argument("--phases", action="store_true", help="RSS after each start-up phase")
    args = parser.parse_args()
    if args.phases:
        for name in args.models.split(","):
            path = resolve(name)
            print(f"{path.name}: KV {args.kv} {args.tokens} tokens, numerics {args.numerics}, MB")
            argv = [str(path), str(args.tokens), args.kv, args.numerics]
            subprocess.run([sys.executable, "-m", "bench.memory_phases", *argv], check=True)
        return
    print(f"KV capacity {args.tokens} tokens; MB (2^20 bytes); tl-serve numerics {args.numerics}")
    for name in args.models.split(","):
        path = resolve(name)
        file_mb = path.stat().st_size / 2**20
        rss, peak = llama_server_rss(path, args.tokens)
        print(f"{path.name}: file {file_mb:.0f}")
        print(f"  llama-server (KV f16 {kv_mb(path, args.tokens, 2):.0f})   "
              f"RSS {rss:7.0f}   peak {peak:7.0f}")  # fmt: skip
        for kv, itemsize in (("f16", 2), ("f32", 4)):
            rss_c, peak_c, weights, warmup = core_rss(path, args.tokens, kv, args.numerics)
            print(f"  tl-serve core (KV {kv} {kv_mb(path, args.tokens, itemsize):.0f})  "
                  f"RSS {rss_c:7.0f}   peak {peak_c:7.0f}   weights {weights * 1e6 / 2**20:.0f}   "
                  f"RSS / llama-server {rss_c / rss:.2f}   warm-up {warmup:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()

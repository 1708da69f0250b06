"""ServerProcess: one HTTP server under test (tl-serve, llama-cpp-python, llama-server) on loopback.

Started by bench/compare.py and bench/soak.py, one at a time; stopped with SIGTERM (SIGKILL
after a grace period), its output kept in a log file beside the results.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LLAMACPP_VENV = ROOT / ".cache" / "llamacpp-venv"
STOP_GRACE_S = 60.0


def in_checkout(text: str) -> str:
    """text with this checkout's root left out of its paths (relative to the repository)."""
    return text.replace(f"{ROOT}/", "")


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of GET url, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


def busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all CPUs, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET url and decode the JSON answer (raises on a non-2xx status)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """POST a JSON body and decode the JSON answer (raises on a non-2xx status)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _proc_stats() -> dict[int, list[str]]:
    """Every live process's /proc/<pid>/stat fields after the command name (state first)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone since the listing
                continue
    return out


class ServerProcess:
    """A server process: started on enter, ready once `ready_url` answers 200, stopped on exit."""

    def __init__(
        self,
        label: str,
        argv: list[str],
        *,
        port: int,
        ready_url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        health_url: str = "",
        ready_timeout_s: float = 600.0,
    ) -> None:
        self.label = label
        self.argv = argv
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.ready_url = ready_url
        self.health_url = health_url or self.base_url  # tl-serve: /metrics lives there
        self.log_path = log_path
        self.env = dict(os.environ) | (env or {})
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while http_status(self.ready_url) != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited ({self.proc.returncode}): {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.label} not ready after {self.ready_timeout_s:.0f} s")
            time.sleep(0.5)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self, pid: int | None = None) -> list[int]:
        """Pids of the direct children of pid (default: this server; tl-serve: the engine core)."""
        parent = self.pid if pid is None else pid
        return [p for p, stat in _proc_stats().items() if int(stat[1]) == parent]

    def tree_cpu_s(self) -> float:
        """CPU seconds used so far by this server and its live descendants."""
        stats = _proc_stats()
        total, todo = 0.0, [self.pid]
        while todo:
            pid = todo.pop()
            if pid in stats:
                total += (int(stats[pid][11]) + int(stats[pid][12])) / os.sysconf("SC_CLK_TCK")
            todo += [p for p, stat in stats.items() if int(stat[1]) == pid]
        return total

    def stop(self) -> None:
        """SIGTERM (tl-serve drains), then SIGKILL after the grace period."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tl_serve(log_dir: Path, label: str = "tl-serve", **engine: object) -> ServerProcess:
    """tl-serve (`frontend`) with its own runtime.toml in log_dir: loopback ports, `engine` overrides."""
    port, health = free_port(), free_port()
    keys: dict[str, object] = {
        "http_listen": f"127.0.0.1:{port}",
        "health_listen": f"127.0.0.1:{health}",
        **engine,
    }
    lines = ["[engine]", *(f"{k} = {json.dumps(v)}" for k, v in keys.items())]
    stem = re.sub(r"[^\w.-]+", "-", label)
    config = log_dir / f"{stem}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join(lines) + "\n")
    return ServerProcess(
        label,
        [str(ROOT / ".venv" / "bin" / "frontend"), "--config", str(config)],
        port=port,
        ready_url=f"http://127.0.0.1:{health}/readyz",
        log_path=log_dir / f"{stem}.log",
        env={"NUMBA_CACHE_DIR": str(ROOT / ".cache" / "numba")},
        health_url=f"http://127.0.0.1:{health}",
    )


def llama_cpp_python(
    log_dir: Path, model: Path, threads: int = 2, n_ctx: int = 4096
) -> ServerProcess:
    """llama-cpp-python's server on the same GGUF; one request at a time, never interrupted."""
    port = free_port()
    argv = [
        str(LLAMACPP_VENV / "bin" / "python"),
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "False",
    ]
    return ServerProcess(
        "llama-cpp-python",
        argv,
        port=port,
        ready_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=log_dir / "llama-cpp-python.log",
    )


def llama_server(
    binary: Path,
    log_dir: Path,
    model: Path,
    parallel: int,
    ctx_per_slot: int,
    *,
    label: str = "llama-server",
    threads: int = 2,
) -> ServerProcess:
    """llama.cpp's own llama-server: `parallel` slots, continuous batching.

    With -np given, this llama.cpp splits -c evenly over the slots (no unified KV cache unless
    -kvu), so -c is parallel x ctx_per_slot: each request may hold ctx_per_slot tokens.
    """
    port = free_port()
    argv = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(parallel),
        "-c",
        str(ctx_per_slot * parallel),
    ]
    stem = re.sub(r"[^\w.-]+", "-", label)
    return ServerProcess(
        label,
        argv,
        port=port,
        ready_url=f"http://127.0.0.1:{port}/health",
        log_path=log_dir / f"{stem}.log",
    )

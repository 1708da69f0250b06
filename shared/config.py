"""runtime.toml: one [engine] table, decoded strictly, with TL_ENGINE__<KEY> overrides.

This is the only module that reads the environment.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from shared.core_link import CurveKeys, runtime_dir

ENV_PREFIX = "TL_ENGINE__"
BUNDLED_MODEL = "~/.cache/tl-serve/SmolLM2-135M-Instruct.Q4_1.gguf"


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every knob of one deployment; defaults serve the bundled model well."""

    # model
    model_dir: str = BUNDLED_MODEL
    model_id: str = ""  # "" = derived from model_dir
    # the ids clients may name (the first is the one responses and metrics carry); () = model_id
    served_model_name: tuple[str, ...] = ()
    max_model_len: int = 0  # 0 = the model's own context, capped at 8192
    chat_template: str = ""  # a file, or the template itself; "" = the model's own
    # listeners
    http_listen: str = ":8000"
    health_listen: str = ":9464"
    api_keys: tuple[str, ...] = ()  # empty = no auth
    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 1024
    max_embedding_inputs: int = 2048  # inputs of one embeddings request
    max_embedding_tokens: int = 65536  # tokens of one embeddings request, all inputs together
    cors_origins: tuple[str, ...] = ()  # origins browsers may call from ("*": any); () = no CORS
    metrics_on_api_port: bool = False  # /metrics on the API port too
    force_include_usage: bool = False  # every stream ends with a usage chunk, asked for or not
    sse_ping_interval_s: float = 15.0  # a stream with nothing to send says `: ping` this often
    # admission (global, in the core)
    queue_capacity: int = 256
    queue_deadline_ms: int = 60_000
    # scheduling
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    prefill_chunk: int = 256  # 0 = whole prompts
    # kv cache
    # 16: chosen when the prefix cache matched whole blocks only, and a chat template's shared
    # opening is often shorter than 32 tokens (SmolLM2's system turn: 24), which 32-token
    # blocks never reused; partial-block hits (enginecore/radix_cache.py) now reuse it at any
    # size, and decode steps measured 16 and 32 alike since (32 / 16: 0.95-1.04 from 1 to 64
    # sequences, bench/README.md), so 16 stays. A decode's attention pays a little
    # per block it jumps to (the allocator keeps a table's blocks adjacent where it can,
    # enginecore/free_blocks.py): 64 decodes over scattered blocks, 8.7 ms at 16 against 8.1
    # at 32 (bench/README.md).
    block_size: int = 16
    num_kv_blocks: int = 0  # 0 = sized from kv_cache_bytes
    kv_cache_bytes: int = 1 << 30
    prefix_cache: Literal["radix", "none"] = "radix"
    # arithmetic of the quantized matmuls: int16 activations keep every reference greedy
    # continuation of the bundled model and are faster than exact fp32 (bench/README.md)
    numerics: Literal["exact", "int8", "int16"] = "int16"
    # fp16 K and V keep them too, and halve the bytes attention streams: faster at every batch
    # size measured (bench/README.md)
    kv_cache_dtype: Literal["f32", "f16"] = "f16"
    # speculative decoding
    speculative: Literal["none", "prompt_lookup"] = "none"
    spec_num_tokens: int = 16  # most drafts per step; each request adapts below it
    spec_ngram_max: int = 4
    spec_ngram_min: int = 2
    # processes
    core_address: str = ""  # "" = an ipc socket in the runtime dir, derived from http_listen
    spawn_core: bool = True
    # CURVE security of a tcp core link (shared/core_link.py): certificate files
    curve_core_key: str = ""  # the core's: its secret certificate on the core, public elsewhere
    curve_frontend_key: str = ""  # this frontend's secret certificate
    curve_authorized_keys: str = ""  # directory of the frontends' public certificates (core)
    client_timeout_s: float = 10.0
    drain_timeout_s: float = 30.0
    core_stall_timeout_s: float = 60.0  # a spawned core with work and no step this long is killed
    unhealthy_after_s: float = 120.0  # /healthz fails after this long with no core; 0 = never
    num_threads: int = 0  # compute threads of the core; 0 = all cores
    # test knobs
    step_delay_ms: int = 0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        positive = (
            "queue_capacity",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "kv_cache_bytes",
            "max_body_bytes",
            "max_messages",
            "max_embedding_inputs",
            "max_embedding_tokens",
            "spec_num_tokens",
            "spec_ngram_max",
            "spec_ngram_min",
        )
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1")
        non_negative = (
            "max_model_len",
            "queue_deadline_ms",
            "prefill_chunk",
            "num_kv_blocks",
            "step_delay_ms",
            "num_threads",
        )
        for key in non_negative:
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0")
        for key in ("client_timeout_s", "sse_ping_interval_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0")
        _check_model_names(self.model_id, self.served_model_name)
        for key in ("drain_timeout_s", "core_stall_timeout_s", "unhealthy_after_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0")
        if self.spec_ngram_min > self.spec_ngram_max:
            raise ValueError("spec_ngram_min must be <= spec_ngram_max")
        if self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        for key in ("http_listen", "health_listen"):
            parse_listen(getattr(self, key), key)
        if not self.spawn_core and not self.core_address:
            raise ValueError("core_address is required when spawn_core = false")
        if self.core_address and not self.core_address.startswith(("tcp://", "ipc://")):
            raise ValueError("core_address must be a tcp:// or ipc:// endpoint")

    @property
    def model_path(self) -> Path:
        return Path(self.model_dir).expanduser()

    @property
    def resolved_core_address(self) -> str:
        """The ZeroMQ endpoint of the core: core_address, else an ipc socket named by the API
        port in this user's private runtime directory."""
        if self.core_address:
            return self.core_address
        port = parse_listen(self.http_listen)[1]
        return f"ipc://{runtime_dir() / f'core-{port}.sock'}"

    @property
    def curve_keys(self) -> CurveKeys:
        return CurveKeys(self.curve_core_key, self.curve_frontend_key, self.curve_authorized_keys)

    @property
    def served_model_id(self) -> str:
        """The canonical id: what responses and metrics name."""
        return self.served_model_ids[0]

    @property
    def served_model_ids(self) -> tuple[str, ...]:
        """Every id that names the served model, the canonical one first."""
        if self.served_model_name:
            return self.served_model_name
        if self.model_id:
            return (self.model_id,)
        path = self.model_path
        return (path.stem if path.suffix == ".gguf" else path.name,)


def _check_model_names(model_id: str, names: tuple[str, ...]) -> None:
    if names and model_id:
        raise ValueError("set served_model_name or model_id, not both")
    if not all(names) or len(set(names)) != len(names):
        raise ValueError("served_model_name must hold distinct, non-empty ids")


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)


class ConfigError(ValueError):
    """runtime.toml or an override is wrong; the message names the key."""


def parse_listen(value: str, key: str = "listen") -> tuple[str, int]:
    """':8000' -> ('0.0.0.0', 8000); '127.0.0.1:8000' -> ('127.0.0.1', 8000)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{key} must look like ':8000' or '127.0.0.1:8000', got {value!r}")
    return (host.strip("[]") or "0.0.0.0", int(port))


def prepare_blas_environment() -> None:
    """Let OpenBLAS's idle workers sleep at once instead of spinning for ~0.1 s after a call.

    The core alternates BLAS calls (prefill, big batches) with 2-thread numba kernels (decode);
    a spinning BLAS worker takes a core from the next decode step (10.5 ms instead of 6.9,
    bench/README.md). OpenBLAS reads this when numpy loads, so it must run before that.
    """
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


def _override_value(text: str) -> object:
    """An env value is a TOML literal if it parses as one, else a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read runtime.toml (or only defaults when path is None) and apply TL_ENGINE__ overrides."""
    env = os.environ if environ is None else environ
    raw: dict[str, object] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
    table = raw.setdefault("engine", {})
    if not isinstance(table, dict):
        raise ConfigError("[engine] must be a table")
    known = set(EngineConfig.__struct_fields__)
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in known:
            raise ConfigError(f"unknown override {name}: engine has no key {key!r}")
        table[key] = _override_value(value)
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid config: {e}") from e

"""`python -m enginecore --config runtime.toml`: load the model, warm up, serve frontends."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from types import FrameType

from enginecore.block_manager import BlockManager
from enginecore.channel import Channel
from enginecore.engine import Engine
from enginecore.grammar import GrammarCompiler
from enginecore.kernels.threads import set_num_threads
from enginecore.model_runner import ModelRunner
from enginecore.sampler import Sampler
from enginecore.scheduler import Scheduler, SchedulerConfig
from enginecore.spec import NgramProposer
from shared.config import ConfigError, EngineConfig, load
from shared.grammar import grammar_tokenizer
from shared.log import setup_logging
from shared.protocol import Welcome
from shared.tokenizer import Tokenizer
from shared.tokenizer_metadata import TokenizerMetadata, read_tokenizer_metadata

log = logging.getLogger("enginecore")


def grammar_compiler(metadata: TokenizerMetadata, welcome: Welcome) -> GrammarCompiler | None:
    """The vocabulary's bytes, from the one tokenizer builder: what grammars mask. A model with
    no end-of-generation token cannot end a document: its core refuses grammars."""
    if not welcome.eos_ids:
        return None
    tokenizer = Tokenizer(metadata)
    return GrammarCompiler(grammar_tokenizer(tokenizer, welcome.vocab_size, welcome.eos_ids))


def build(cfg: EngineConfig, channel: Channel, owner_token: str = "") -> Engine:
    t0 = time.monotonic()
    set_num_threads(cfg.num_threads)
    path = cfg.model_path
    # first: the loader then reuses the parsed file, and drops it after the weights (parsed
    # after them, its vocabulary's objects stayed resident)
    metadata = read_tokenizer_metadata(path)
    runner = ModelRunner.from_path(
        path, cfg.block_size, cfg.num_kv_blocks, cfg.kv_cache_bytes, cfg.max_model_len,
        cfg.numerics, cfg.kv_cache_dtype,
    )  # fmt: skip
    runner.warmup()
    blocks = BlockManager(runner.num_blocks, cfg.block_size, cfg.prefix_cache == "radix")
    proposer = (
        NgramProposer(cfg.spec_ngram_max, cfg.spec_ngram_min, cfg.spec_num_tokens)
        if cfg.speculative == "prompt_lookup"
        else None
    )
    sched_cfg = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        prefill_chunk=cfg.prefill_chunk,
        max_model_len=runner.max_model_len,
        queue_capacity=cfg.queue_capacity,
    )
    welcome = Welcome(
        model_id=cfg.served_model_id,
        max_model_len=runner.max_model_len,
        vocab_size=runner.cfg.vocab_size,
        eos_ids=list(metadata.eos_ids),
        block_size=cfg.block_size,
        core_pid=os.getpid(),
    )
    engine = Engine(
        channel=channel,
        runner=runner,
        scheduler=Scheduler(sched_cfg, blocks, proposer),
        sampler=Sampler(runner.cfg.vocab_size),
        welcome=welcome,
        client_timeout_s=cfg.client_timeout_s,
        queue_deadline_ms=cfg.queue_deadline_ms,
        step_delay_ms=cfg.step_delay_ms,
        drain_timeout_s=cfg.drain_timeout_s,
        owner_token=owner_token,
        grammars=grammar_compiler(metadata, welcome),
    )
    engine.masker.warmup()
    log.info(
        "serving %s at %s: %d KV blocks of %d, max_model_len %d, ready in %.1f s",
        welcome.model_id, cfg.resolved_core_address, runner.num_blocks, cfg.block_size,
        runner.max_model_len, time.monotonic() - t0,
    )  # fmt: skip
    return engine


class _StopWhileStartingError(Exception):
    """SIGTERM or SIGINT while the core was still starting."""


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    raise _StopWhileStartingError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enginecore", description=__doc__)
    parser.add_argument("--config", help="runtime.toml (defaults serve the bundled model)")
    # internal: the spawning frontend writes the token of its ShutdownCore on our stdin
    parser.add_argument("--owner-stdin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        cfg = load(args.config).engine
    except ConfigError as e:
        print(f"enginecore: {e}", file=sys.stderr)  # noqa: T201
        return 2
    setup_logging("enginecore", cfg.log_level)
    owner_token = sys.stdin.readline().strip() if args.owner_stdin else ""
    signal.signal(signal.SIGTERM, _stop_starting)
    signal.signal(signal.SIGINT, _stop_starting)
    try:
        # bound first: a refused address fails at once, and the socket file is ours to remove
        # Busy during a long step: often enough for a frontend as patient as this core
        keepalive_s = min(1.0, cfg.client_timeout_s / 4)
        channel = Channel(cfg.resolved_core_address, cfg.curve_keys, keepalive_s)
    except ValueError as e:
        log.error("cannot start: %s", e)
        return 2
    except _StopWhileStartingError:
        return 0
    try:
        engine = build(cfg, channel, owner_token)
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        channel.close()
        return 2
    except _StopWhileStartingError:
        log.info("stopped while starting")
        channel.close()
        return 0

    def on_term(signum: int, frame: FrameType | None) -> None:
        engine.drain()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return engine.run()
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())

"""`frontend [--config runtime.toml]`: serve the OpenAI API until SIGTERM, then drain and exit 0."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from frontend.chat_template import TemplateError
from frontend.server import Server
from shared.config import ConfigError, EngineConfig, load

log = logging.getLogger("frontend")


async def serve(config: EngineConfig, config_path: str | None) -> int:
    """Exit status: 0 after a drain, 1 if the model or the core could not be brought up."""
    try:
        server = Server(config, config_path)
    except (OSError, ValueError, TemplateError) as e:
        log.error("cannot load the model's tokenizer and template: %s", e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            await server.start()
        except OSError as e:
            log.error("cannot listen: %s", e)
            await server.close()
            return 1
        stopped = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(server.wait_failed())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, failed):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if failed.done() and not failed.cancelled():
            log.error("giving up: %s", failed.result())
            await server.close()
            return 1
        log.info("SIGTERM: draining")
        await server.drain()
        return 0
    finally:
        server.kill_core()  # a no-op after a clean drain; never leave an orphan core


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frontend", description=__doc__)
    parser.add_argument(
        "--config", help="runtime.toml; without it, defaults and TL_ENGINE__ overrides"
    )
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as e:
        sys.stderr.write(f"frontend: {e}\n")
        return 2
    logging.basicConfig(
        level=config.engine.log_level.upper(),
        format="%(asctime)s %(levelname)s frontend %(name)s: %(message)s",
    )
    return asyncio.run(serve(config.engine, args.config))


if __name__ == "__main__":
    sys.exit(main())

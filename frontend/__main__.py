"""`frontend [--config runtime.toml] [--workers N]`: serve the OpenAI API until SIGTERM, then drain."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

import msgspec

from frontend.api.middleware import RequestIdFilter
from frontend.server import Server
from frontend.text.chat_template import TemplateError
from frontend.workers import WorkerRole
from shared.config import ConfigError, EngineConfig, load

log = logging.getLogger("frontend")


async def serve(
    config: EngineConfig, config_path: str | None, workers: int = 1, role: WorkerRole | None = None
) -> int:
    """Exit status: 0 after a drain, 1 if the model or the core could not be brought up."""
    try:
        server = Server(config, config_path, workers=workers, role=role)
    except (OSError, ValueError, TemplateError) as e:
        log.error("cannot start: %s", e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        stopped = asyncio.create_task(stop.wait())
        started = asyncio.create_task(server.start())
        await asyncio.wait({started, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # SIGTERM to a worker still waiting for the core
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)
            await server.close()
            return 0
        try:
            started.result()
        except OSError as e:
            log.error("cannot listen: %s", e)
            stopped.cancel()
            await server.close()
            return 1
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
        server.kill_core()  # a no-op after a clean drain; never leave an orphan core or worker


def _workers(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frontend", description=__doc__)
    parser.add_argument(
        "--config", help="runtime.toml; without it, defaults and TL_ENGINE__ overrides"
    )
    parser.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="frontend processes sharing the API port and one core (default 1)",
    )
    # internal: how worker 0 starts the others (a WorkerRole as JSON)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
        role = None if args.worker is None else msgspec.json.decode(args.worker, type=WorkerRole)
    except (ConfigError, msgspec.ValidationError, msgspec.DecodeError) as e:
        sys.stderr.write(f"frontend: {e}\n")
        return 2
    if role is not None and args.workers != 1:
        sys.stderr.write("frontend: --worker and --workers exclude each other\n")
        return 2
    name = "frontend" if role is None else f"frontend[{role.index}]"
    logging.basicConfig(
        level=config.engine.log_level.upper(),
        format=f"%(asctime)s %(levelname)s {name} [%(request_id)s] %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())  # the request a line is written for, or "-"
    return asyncio.run(serve(config.engine, args.config, args.workers, role))


if __name__ == "__main__":
    sys.exit(main())

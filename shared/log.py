"""One log format for every process: time, process, level, logger, message."""

from __future__ import annotations

import logging
import sys


def setup_logging(process_name: str, level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s {process_name}[%(process)d] %(levelname)s %(name)s: %(message)s",
        force=True,
    )

"""`python -m frontend.core.keys DIR NAME [NAME ...]`: CURVE certificates for the core link.

Writes DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600) for each NAME, in
pyzmq's zmq.auth format. Typically one `core` and one per frontend host; then
  core:      curve_core_key = "DIR/core.key_secret", curve_authorized_keys = a directory
             holding the frontends' NAME.key files
  frontends: curve_core_key = "DIR/core.key", curve_frontend_key = "DIR/NAME.key_secret"
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import zmq.auth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frontend.core.keys", description=__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        public, secret = zmq.auth.create_certificates(str(args.dir), name)
        os.chmod(secret, 0o600)
        sys.stdout.write(f"{public}\n{secret}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a busy engine core spends its time: py-spy samples the core while it decodes.

    python -m bench.profile [--concurrency 64] [--seconds 12]   (py-spy: pip install -e '.[bench]')

Starts a core on the bundled model (bench.engine.Core), keeps `concurrency` greedy requests of
128 tokens running, records the core with py-spy for `seconds`, and prints the share of samples
per source line, self and inclusive, for the core's own code.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.engine import Core, random_prompts
from shared.protocol import SamplingParams


def summarize(raw: Path, top: int) -> None:
    own, inclusive, total = Counter[str](), Counter[str](), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    print(f"{total} samples")
    print("self:")
    for frame, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {frame}")
    print("inclusive (enginecore only):")
    for frame, n in inclusive.most_common():
        if "enginecore/" in frame and n / total >= 0.01:
            print(f"  {100 * n / total:5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    # the venv's bin is not on PATH when the bench runs as .venv/bin/python -m bench.profile
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    raw = Path(tempfile.mkdtemp(prefix="tl-profile-")) / "core.txt"
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    with Core() as core:
        core.run(random_prompts(2, 32, 99), params)  # warm
        cmd = [spy, "record", "-p", str(core.proc.pid), "-o", str(raw), "-f", "raw", "-r", "200",
               "--nonblocking", "--duration", str(args.seconds)]  # fmt: skip
        recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = core.run(random_prompts(args.concurrency, 32, args.concurrency), params)
        recorder.wait()
    wall = max(r["done"])
    print(f"{args.concurrency} concurrent: {sum(r['tokens']) / wall:.1f} tok/s over {wall:.1f} s")
    summarize(raw, args.top)


if __name__ == "__main__":
    main()

"""Plot load results: output tokens/s and TTFT p50/p99 against load, one line per label.

    python -m bench.plot bench/out/tl-serve.json bench/out/llama-cpp.json -o bench/out/load.png

Levels of result files with the same label are merged into one line.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import msgspec
from matplotlib.figure import Figure

from bench.load_stats import LevelReport, RunReport


def load_reports(paths: Sequence[Path]) -> list[RunReport]:
    return [msgspec.json.decode(p.read_bytes(), type=RunReport) for p in paths]


def level_x(level: LevelReport) -> float:
    """Concurrency for a closed-loop level, the request rate for an open-loop one."""
    if level.concurrency is not None:
        return float(level.concurrency)
    assert level.request_rate is not None
    return level.request_rate


def lines(reports: Sequence[RunReport]) -> dict[str, list[LevelReport]]:
    """Levels by label, sorted by load (a later file's level at the same load replaces)."""
    by_label: dict[str, dict[float, LevelReport]] = defaultdict(dict)
    for report in reports:
        for level in report.levels:
            by_label[report.label][level_x(level)] = level
    return {label: [pts[x] for x in sorted(pts)] for label, pts in by_label.items()}


def x_label(reports: Sequence[RunReport]) -> str:
    closed = {lv.concurrency is not None for r in reports for lv in r.levels}
    if closed == {True}:
        return "concurrency (requests in flight)"
    if closed == {False}:
        return "request rate (req/s, Poisson)"
    return "concurrency, or request rate (req/s)"


def plot(reports: Sequence[RunReport], out: Path) -> None:
    """Two panels side by side, written as a PNG."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    tput, ttft = fig.subplots(1, 2)
    xs_all: list[float] = []
    for i, (label, levels) in enumerate(lines(reports).items()):
        color = f"C{i % 10}"
        xs = [level_x(lv) for lv in levels]
        xs_all += xs
        tput.plot(xs, [lv.output_tokens_per_s for lv in levels], "o-", color=color, label=label)
        timed = [(x, lv.ttft_ms) for x, lv in zip(xs, levels, strict=True) if lv.ttft_ms]
        tx = [x for x, _ in timed]
        ttft.plot(tx, [d.p50 for _, d in timed], "o-", color=color, label=f"{label} p50")
        ttft.plot(tx, [d.p99 for _, d in timed], "s--", color=color, label=f"{label} p99")
    tput.set_title("output throughput")
    tput.set_ylabel("output tokens/s")
    ttft.set_title("time to first token")
    ttft.set_ylabel("TTFT (ms)")
    for ax in (tput, ttft):
        ax.set_xlabel(x_label(reports))
        if xs_all and min(xs_all) > 0 and max(xs_all) >= 4 * min(xs_all):
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ticks = sorted(set(xs_all))
        ax.set_xticks(ticks, labels=[f"{x:g}" for x in ticks])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="JSON result files of bench.load")
    p.add_argument("-o", "--out", type=Path, default=Path("bench/out/load.png"))
    args = p.parse_args(argv)
    plot(load_reports(args.results), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The speed targets: tl-serve's output tok/s over llama-server's at the same concurrency, and
TTFT p99 below llama-server's, per model."""

from __future__ import annotations

from typing import NamedTuple

from bench.load_stats import LevelReport

TL = "tl-serve"
ANCHOR = "llama-server"  # the label prefix of llama.cpp's server


class Target(NamedTuple):
    """Least tl-serve / llama-server throughput ratio by concurrency; levels where tl-serve's
    TTFT p99 must be below llama-server's."""

    throughput: dict[int, float]
    ttft_below_at: tuple[int, ...]


KQUANT_AND_LARGE = Target({1: 1.2, 16: 2.0}, ())
TARGETS = {
    "bundled": Target({1: 1.5, 16: 3.0, 64: 3.0}, (4, 16, 64)),
    "Q4_K_M": KQUANT_AND_LARGE,
    "1.7B": KQUANT_AND_LARGE,
    "1.7B-Q4_K_M": KQUANT_AND_LARGE,
}


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def ratios(levels: dict[str, dict[int, LevelReport]], key: str) -> list[str]:
    """A table of tl-serve against each llama.cpp server per level, and the targets' verdicts."""
    tl = levels.get(TL, {})
    anchor = next((by_c for label, by_c in levels.items() if label.startswith(ANCHOR)), {})
    others = {k: v for k, v in levels.items() if k != TL and not k.startswith(ANCHOR)}
    if not tl or not anchor:
        return ["(no tl-serve run or no llama-server run to compare)"]
    target = TARGETS.get(key, Target({}, ()))
    rows = [
        "| concurrency | tl-serve tok/s | llama-server tok/s | ratio | throughput target "
        "| TTFT p99 tl-serve / llama-server (ms) | TTFT target |"
        + "".join(f" vs {k} |" for k in others),
        "|---:|---:|---:|---:|---|---|---|" + "---:|" * len(others),
    ]
    for c, lv in sorted(tl.items()):
        base = anchor.get(c)
        if base is None:
            continue
        ratio = lv.output_tokens_per_s / base.output_tokens_per_s
        want = target.throughput.get(c)
        tput = "-" if want is None else f"{_verdict(ratio >= want)} (>= {want:g}x)"
        tl_p99 = lv.ttft_ms.p99 if lv.ttft_ms else float("inf")
        base_p99 = base.ttft_ms.p99 if base.ttft_ms else float("inf")
        ttft = _verdict(tl_p99 < base_p99) + " (below)" if c in target.ttft_below_at else "-"
        extra = "".join(
            f" {lv.output_tokens_per_s / o[c].output_tokens_per_s:.2f}x |" if c in o else " - |"
            for o in others.values()
        )
        rows.append(
            f"| {c} | {lv.output_tokens_per_s:.1f} | {base.output_tokens_per_s:.1f} | "
            f"{ratio:.2f}x | {tput} | {tl_p99:,.0f} / {base_p99:,.0f} | {ttft} |{extra}"
        )
    if key not in TARGETS:
        rows.append(f"\nNo target is set for `{key}`: the ratios are for reference.")
    return rows

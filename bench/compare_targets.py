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
    "1.7B": KQUANT_AND_LARGE,  # and every other file of that shape: 1.7B-Q4_K_M, 1.7B-Q4_1-pure
}


def target_for(key: str) -> Target | None:
    """The targets of a bench model by its name; the 1.7B shape's hold for each of its files."""
    return TARGETS.get(key) or TARGETS.get(key.split("-")[0] if key.startswith("1.7B") else "")


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _ratio(lv: LevelReport, base: LevelReport | None) -> float | None:
    """tl-serve's output tok/s over another's; None when the other completed nothing."""
    if base is None or base.output_tokens_per_s <= 0:
        return None
    return lv.output_tokens_per_s / base.output_tokens_per_s


def _beat_an_empty_level(lv: LevelReport, base: LevelReport) -> bool:
    """tl-serve completed every request of a level in which llama-server completed none (its
    requests hit the level's time cap): no ratio, but no doubt either."""
    return base.completed == 0 and lv.completed > 0 and lv.failed == 0


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _p99(ms: float) -> str:
    return "-" if ms == float("inf") else f"{ms:,.0f}"


def ratios(levels: dict[str, dict[int, LevelReport]], key: str) -> list[str]:
    """A table of tl-serve against each llama.cpp server per level, and the targets' verdicts."""
    tl = levels.get(TL, {})
    anchor = next((by_c for label, by_c in levels.items() if label.startswith(ANCHOR)), {})
    others = {k: v for k, v in levels.items() if k != TL and not k.startswith(ANCHOR)}
    if not tl or not anchor:
        return ["(no tl-serve run or no llama-server run to compare)"]
    target = target_for(key) or Target({}, ())
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
        ratio = _ratio(lv, base)
        want = target.throughput.get(c)
        if want is None:
            tput = "-"
        elif _beat_an_empty_level(lv, base):
            tput = f"yes (>= {want:g}x; llama-server completed none)"
        else:
            tput = f"{_verdict(ratio is not None and ratio >= want)} (>= {want:g}x)"
        tl_p99 = lv.ttft_ms.p99 if lv.ttft_ms else float("inf")
        base_p99 = base.ttft_ms.p99 if base.ttft_ms else float("inf")
        ttft = _verdict(tl_p99 < base_p99) + " (below)" if c in target.ttft_below_at else "-"
        extra = "".join(f" {_times(_ratio(lv, o.get(c)))} |" for o in others.values())
        rows.append(
            f"| {c} | {lv.output_tokens_per_s:.1f} | {base.output_tokens_per_s:.1f} | "
            f"{_times(ratio)} | {tput} | {_p99(tl_p99)} / {_p99(base_p99)} | {ttft} |{extra}"
        )
    if target_for(key) is None:
        rows.append(f"\nNo target is set for `{key}`: the ratios are for reference.")
    return rows

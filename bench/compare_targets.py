"""The speed targets: tl-serve's output tok/s over llama-server's at the same concurrency, and
TTFT p99 below llama-server's, per model."""

from __future__ import annotations

import re
import statistics
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
    """The targets of a bench model by its name; the 1.7B shape's hold for each of its files,
    and a model's hold for it compiled as an older CPU (`bundled@avx2`: bench/isa.py)."""
    key = key.partition("@")[0]
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


def _throughput_verdict(want: float | None, ratio: float | None, beat_empty: bool) -> str:
    """The throughput target's cell: none set, met by completing a level llama-server did not,
    or the ratio against the least one."""
    if want is None:
        return "-"
    if beat_empty:
        return f"yes (>= {want:g}x; llama-server completed none)"
    return f"{_verdict(ratio is not None and ratio >= want)} (>= {want:g}x)"


def _ttft_p99(lv: LevelReport) -> float:
    """TTFT p99 in ms; infinite when nothing completed."""
    return lv.ttft_ms.p99 if lv.ttft_ms else float("inf")


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _p99(ms: float) -> str:
    return "-" if ms == float("inf") else f"{ms:,.0f}"


def round_label(label: str, round_: int) -> str:
    """A server's label in one round of several (bench.compare --rounds)."""
    return f"{label} (round {round_})"


_ROUND = re.compile(r"^(.*) \(round (\d+)\)$")


def ratios(levels: dict[str, dict[int, LevelReport]], key: str) -> list[str]:
    """A table of tl-serve against each llama.cpp server per level, and the targets' verdicts
    (with rounds: the rounds' figures side by side, judged on their median)."""
    by_round: dict[int, dict[str, dict[int, LevelReport]]] = {}
    for label, by_c in levels.items():
        m = _ROUND.match(label)
        if m:
            by_round.setdefault(int(m[2]), {})[m[1]] = by_c
    if by_round:
        singles = {k: v for k, v in levels.items() if not _ROUND.match(k)}
        return _rounds_table([by_round[r] for r in sorted(by_round)], key, singles)
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
        tput = _throughput_verdict(want, ratio, _beat_an_empty_level(lv, base))
        tl_p99, base_p99 = _ttft_p99(lv), _ttft_p99(base)
        ttft = _verdict(tl_p99 < base_p99) + " (below)" if c in target.ttft_below_at else "-"
        extra = "".join(f" {_times(_ratio(lv, o.get(c)))} |" for o in others.values())
        rows.append(
            f"| {c} | {lv.output_tokens_per_s:.1f} | {base.output_tokens_per_s:.1f} | "
            f"{_times(ratio)} | {tput} | {_p99(tl_p99)} / {_p99(base_p99)} | {ttft} |{extra}"
        )
    if target_for(key) is None:
        rows.append(f"\nNo target is set for `{key}`: the ratios are for reference.")
    return rows


def _rounds_table(
    rounds: list[dict[str, dict[int, LevelReport]]],
    key: str,
    others: dict[str, dict[int, LevelReport]],
) -> list[str]:
    """ratios() for rounds of tl-serve and llama-server taking turns: each level's figures of
    every round, and the verdicts on the median ratio (TTFT: below in every round); `others`,
    servers run once (other numerics or block sizes), a column each: their tok/s and its
    ratio to llama-server's median."""
    pairs = []
    for levels in rounds:
        anchor = next((v for k, v in levels.items() if k.startswith(ANCHOR)), None)
        if TL in levels and anchor is not None:
            pairs.append((levels[TL], anchor))
    if not pairs:
        return ["(no round with both a tl-serve and a llama-server run to compare)"]
    target = target_for(key) or Target({}, ())
    rows = [
        f"Each level ran on both servers back to back, {len(pairs)} rounds (new prompts each); "
        "the throughput verdict is on the median of the rounds' ratios, the TTFT one asks for "
        "every round.",
        "",
        "| concurrency | tl-serve tok/s by round | llama-server tok/s by round | ratios "
        "| median ratio | throughput target | TTFT p99 tl-serve / llama-server (ms) by round "
        "| TTFT target |" + "".join(f" {k} tok/s (x llama-server's median) |" for k in others),
        "|---:|---|---|---|---:|---|---|---|" + "---:|" * len(others),
    ]
    for c in sorted({c for tl, _ in pairs for c in tl}):
        both = [(tl[c], base[c]) for tl, base in pairs if c in tl and c in base]
        if not both:
            continue
        got = [_ratio(lv, base) for lv, base in both]
        known = [r for r in got if r is not None]
        median = statistics.median(known) if known else None
        empty = median is None and all(_beat_an_empty_level(lv, b) for lv, b in both)
        tput = _throughput_verdict(target.throughput.get(c), median, empty)
        p99 = [(_ttft_p99(lv), _ttft_p99(b)) for lv, b in both]
        below = sum(t < b for t, b in p99)
        ttft = (
            f"{_verdict(below == len(both))} (below in {below} of {len(both)})"
            if c in target.ttft_below_at
            else "-"
        )
        anchor_median = statistics.median(b.output_tokens_per_s for _, b in both)
        extra = ""
        for other in others.values():
            lv = other.get(c)
            if lv is None:
                extra += " - |"
                continue
            times = lv.output_tokens_per_s / anchor_median if anchor_median > 0 else None
            extra += f" {lv.output_tokens_per_s:.1f} ({_times(times)}) |"
        rows.append(
            f"| {c} | {', '.join(f'{lv.output_tokens_per_s:.1f}' for lv, _ in both)} "
            f"| {', '.join(f'{b.output_tokens_per_s:.1f}' for _, b in both)} "
            f"| {', '.join(_times(r) for r in got)} | {_times(median)} | {tput} "
            f"| {'; '.join(f'{_p99(t)} / {_p99(b)}' for t, b in p99)} | {ttft} |{extra}"
        )
    if target_for(key) is None:
        rows.append(f"\nNo target is set for `{key}`: the ratios are for reference.")
    return rows

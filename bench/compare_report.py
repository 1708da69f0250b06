"""bench/RESULTS.md from a bench.compare summary: table, ratios against the targets, plot, context."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from bench.compare_targets import llama_server_note, ratios
from bench.load_stats import Dist, LevelReport, RunReport
from bench.server_process import ROOT

SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni")


def read_run(path: str) -> RunReport:
    return msgspec.json.decode(Path(path).read_bytes(), type=RunReport)


def _ms(d: Dist | None, key: str) -> str:
    return "-" if d is None else f"{getattr(d, key):,.0f}"


def _outcome(lv: LevelReport) -> str:
    text = f"{lv.completed}/{lv.failed}"
    if lv.failures:
        text += " (" + ", ".join(f"{k} {v}" for k, v in lv.failures.items()) + ")"
    return text


def levels_by_label(summary: dict[str, Any]) -> dict[str, dict[int, LevelReport]]:
    """Every comparison level by server label and concurrency."""
    out: dict[str, dict[int, LevelReport]] = {}
    for run in summary["runs"]:
        for lv in read_run(run["json"]).levels:
            assert lv.concurrency is not None
            out.setdefault(run["label"], {})[lv.concurrency] = lv
    return out


def _cpu(run: dict[str, Any] | None) -> str:
    if run is None or "other_cores" not in run:
        return "-"
    return f"{run['server_cores']:.2f} / {run['other_cores']:.2f}"


def table(levels: dict[str, dict[int, LevelReport]], summary: dict[str, Any]) -> list[str]:
    runs = {(r["label"], r.get("concurrency")): r for r in summary["runs"]}
    rows = [
        "| server | concurrency | completed/failed | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) "
        "| TPOT p50 (ms) | e2e p50 (ms) | level time (s) | CPU cores: server / others |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, by_c in levels.items():
        for c, lv in sorted(by_c.items()):
            rows.append(
                f"| {label} | {c} | {_outcome(lv)} | {lv.output_tokens_per_s:.1f} "
                f"| {_ms(lv.ttft_ms, 'p50')} | {_ms(lv.ttft_ms, 'p99')} | {_ms(lv.tpot_ms, 'p50')} "
                f"| {_ms(lv.e2e_ms, 'p50')} | {lv.duration_s:.0f} | {_cpu(runs.get((label, c)))} |"
            )
    return rows


def prefix_section(summary: dict[str, Any]) -> list[str]:
    rows = [
        "| prefix_cache | concurrency | completed/failed | TTFT p50 (ms) | TTFT p99 (ms) | output tok/s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    p50: dict[tuple[str, int], float] = {}
    for run in summary.get("prefix", []):
        for lv in read_run(run["json"]).levels:
            assert lv.concurrency is not None
            if lv.ttft_ms:
                p50[(run["mode"], lv.concurrency)] = lv.ttft_ms.p50
            rows.append(
                f"| {run['mode']} | {lv.concurrency} | {_outcome(lv)} | {_ms(lv.ttft_ms, 'p50')} "
                f"| {_ms(lv.ttft_ms, 'p99')} | {lv.output_tokens_per_s:.1f} |"
            )
    for c in sorted({c for _, c in p50}):
        if ("radix", c) in p50 and ("none", c) in p50:
            ratio = p50[("none", c)] / p50[("radix", c)]
            rows.append(f"\nAt concurrency {c}: TTFT p50 {ratio:.1f}x lower with the radix cache.")
    return rows


def overload_section(o: dict[str, Any]) -> list[str]:
    def d(key: str) -> str:
        v = o.get(key)
        return "-" if not v else f"p50 {v['p50']:,.1f} ms, p99 {v['p99']:,.1f}, max {v['max']:,.1f}"

    e = o["engine"]
    return [
        f"tl-serve with `queue_capacity = {e['queue_capacity']}` and `max_num_seqs = "
        f"{e['max_num_seqs']}` (so at most {e['queue_capacity'] + e['max_num_seqs']} requests are "
        f"admitted at once), {o['concurrency']} concurrent streaming clients, {o['requests']} requests "
        f"(closed loop: a refused client sends its next request at once), {o['duration_s']:.0f} s:",
        "",
        f"- sent {o['sent']}: completed {o['completed']}, **429 {o['rejected_429']}**, "
        f"other failures {o['other_failures'] or 'none'}",
        f"- latency of a 429: {d('rejection_ms')}",
        f"- admitted requests: TTFT {d('completed_ttft_ms')}; e2e {d('completed_e2e_ms')}",
        f"- a 429 body: `{o['first_429_body']}`",
        "",
        "Admission is decided in the engine core, which reads new requests between forward "
        "steps: a 429 waits for the step in progress (up to a few hundred ms when the step "
        "carries prefill chunks), not for a queue. The admitted requests' wait is bounded by "
        "the 8 queue places ahead of them, against an unbounded wait on a server that queues "
        "everything (llama-cpp-python's TTFT at 64 streams above).",
    ]


def machine_section(summary: dict[str, Any]) -> list[str]:
    m, v = summary["machine"], summary["versions"]
    flags = m["flags"].split()
    return [
        f"- CPU: {m['cpu']}, {m['logical_cpus']} logical CPUs ({m['cores_per_socket']} cores per "
        f"socket), cache {m['cache']}, {m['mem_gib']} GiB RAM; shared with other sessions' work: "
        "each server start waited for a 1-minute load average below `--wait-load`, each level "
        "for the other processes to use under `--wait-others` cores over 3 s (figures beside "
        "each command below).",
        f"- SIMD flags: {' '.join(f for f in SIMD if f in flags) or 'none'}; absent: "
        f"{' '.join(f for f in SIMD if f not in flags) or 'none'}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- date: {summary['date']} to {summary.get('finished', '?')} (UTC)",
        "",
        "<details><summary>all /proc/cpuinfo flags</summary>",
        "",
        "```",
        m["flags"],
        "```",
        "</details>",
    ]


def soak_section(doc: dict[str, Any]) -> list[str]:
    """The figures of bench/out/soak.json (bench/soak.py)."""
    o = doc["outcomes"]
    other = {k: v for k, v in o.items() if k not in ("completed", "disconnected", "429")}
    rows = [
        f"`{doc['command'].strip()}` on {doc['date']}: tl-serve with the default config, "
        f"{doc['clients']} concurrent streaming clients for {doc['load_s']:.0f} s, unique prompts, "
        f"16-128 output tokens each; {100 * doc['cut_share']:.0f}% of requests close their "
        "connection after a random number of chunks.",
        "",
        f"- requests: {doc['requests']}; completed {o.get('completed', 0)} (all their tokens), "
        f"cut by the client {o.get('disconnected', 0)}, 429 {o.get('429', 0)}, anything else "
        f"{other or 'none'}; {doc['completed_tokens_per_s']:.1f} tok/s of completed requests",
        "- /metrics after the load: "
        + ", ".join(f"`{k} {v:g}`" for k, v in sorted(doc["metrics_after"].items())),
    ]
    half = [s for s in doc["rss_samples"] if s["t"] >= doc["load_s"] / 2]
    for name, r in doc["rss"].items():
        later = [s[name] for s in half if s[name] is not None]
        span = (
            f"; min-max over t >= {half[0]['t']:.0f} s: {min(later):.1f}-{max(later):.1f}"
            if later
            else ""
        )
        rows.append(
            f"- RSS of the {name}: {r['warm_mb']:.1f} MiB after the {doc['warmup_sample_t']:.0f} s "
            f"warm-up, {r['end_mb']:.1f} MiB at the end ({r['growth_mb']:+.1f} MiB, "
            f"{r['growth_pct']:+.1f}%){span}"
        )
    series = ", ".join(
        f"{s['t']:.0f} s: {s['frontend']:.0f}/{s['core']:.0f} ({s.get('kv_cached', 0):.0f})"
        for s in doc["rss_samples"]
    )
    pool = sum(v for k, v in doc["metrics_after"].items() if k.startswith("tl_engine_kv_blocks"))
    rows += [
        f"- every 10 s, RSS of frontend/core in MiB (KV blocks held by the prefix cache): {series}",
        f"- the KV pool ({pool:.0f} blocks) is `np.zeros` at start, so its pages become resident "
        "as blocks are first written: the core's RSS rises while the prefix cache first fills "
        "the pool, then stays within the range above. Growth after that is what would mean a leak.",
        "- checks: "
        + ", ".join(f"{k} {'ok' if v else '**FAILED**'}" for k, v in doc["checks"].items()),
    ]
    return rows


def commands(summary: dict[str, Any], root: Path) -> list[str]:
    """The compare command and each tl-bench run it made, paths relative to the checkout."""
    runs = [*summary["runs"], *summary.get("prefix", [])]
    lines = [
        f"# before: loadavg {r['loadavg']:.2f}, others {r.get('others_before', 0):.2f} cores; "
        f"during: server / others {_cpu(r)} cores\n" + r["command"].replace(f"{root}/", "")
        for r in runs
    ]
    return ["```", f"$ {summary['command'].strip()}", "", "# its tl-bench runs:", *lines, "```"]


def render(
    summary: dict[str, Any], plot_path: Path, results_dir: Path, soak: dict[str, Any] | None
) -> str:
    """The whole RESULTS.md; draws the plot as a side effect."""
    from bench.plot import plot

    levels = levels_by_label(summary)
    plot([read_run(r["json"]) for r in summary["runs"]], plot_path)
    rel = os.path.relpath(plot_path, results_dir)
    parts = [
        "# tl-serve against llama.cpp on the same GGUF",
        "",
        "Generated by `bench/compare.py` (numbers below are from one run; every figure on this "
        "shared 2-vCPU machine moves by +-20% between runs). Load: chat endpoint, streaming, "
        "temperature 0, a unique prompt of 32-64 words per request (seed = concurrency, the "
        "same prompts for every server), 128 output tokens per request (`ignore_eos`; "
        "llama-cpp-python ignores that field and gets `min_tokens: 128` instead). Servers run "
        "one at a time on loopback. llama-cpp-python serves one request at a time "
        "(`--interrupt_requests False`, else a new request cuts the running stream); its "
        "levels are capped by `--max-seconds`, and requests still waiting at the cap count "
        "as `deadline` failures. Its TTFT covers only requests that got an answer "
        "before the cap, so its TTFT p99 understates what a waiting client sees. It sends no "
        "usage chunk, so its tokens are counted one per content chunk. The last column is "
        "the CPU the server's processes used during the level, and the CPU every other "
        "process on the machine used (other sessions' work; near 0 means an undisturbed level), "
        f"in cores (the machine has {summary['machine']['logical_cpus']}).",
        "",
        "## Results",
        "",
        *table(levels, summary),
        "",
        f"![output tok/s and TTFT against concurrency]({rel})",
        "",
        "## Against the targets",
        "",
        "Targets (issue 5): at 1 stream tl-serve >= llama.cpp; at 16 streams >= 2x llama.cpp "
        "server's best configuration and at 64 >= 2.8x, with TTFT p99 below llama.cpp's at both.",
        "",
        *ratios(levels, summary),
        *llama_server_note(levels),
        "",
        "## Overload: 429 at once, not an unbounded queue",
        "",
        *(overload_section(summary["overload"]) if "overload" in summary else ["(not run)"]),
        "",
        "## Shared prefix: ~1000-token system prompt, radix prefix cache on and off",
        "",
        "tl-serve, 16 requests per level, each the same ~1000-token system prompt plus a "
        "unique 16-word question, 32 output tokens; each level has its own system prompt. At "
        "concurrency 1 the first request fills the cache and the other 15 find the prefix "
        "there (TTFT p99 is that first, cold request). At concurrency 16 all 16 arrive "
        "together on a cold cache (at most two 256-token prefill chunks per step), so the "
        "gain there comes from requests admitted after the first ones' chunks were cached.",
        "",
        *prefix_section(summary),
        "",
        "## Soak",
        "",
        *(
            soak_section(soak)
            if soak
            else ["(bench/out/soak.json not found: run `python -m bench.soak`)"]
        ),
        "",
        "## Machine",
        "",
        *machine_section(summary),
        "",
        "## Exact commands",
        "",
        *commands(summary, ROOT),
        "",
    ]
    return "\n".join(parts)

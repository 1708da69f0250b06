"""HTTP load generator for any OpenAI-compatible server (like `vllm bench serve`).

Streams every request to measure time to first token and inter-token latency; runs levels of
closed-loop concurrency (c requests in flight) or open-loop Poisson arrivals; writes a JSON
result file and a PNG plot. Loopback only unless --allow-remote.

    tl-bench --concurrency 1,4,16 --num-requests 32 --input-len 128 --output-len 128
    python -m bench.load --request-rate 2,8 --shared-prefix-len 1000 --input-len 16
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import msgspec

from bench.load_client import Progress, run_level
from bench.load_stats import Dist, LevelReport, RunReport, summarize
from bench.load_workload import ENDPOINTS, LengthDist, Workload, read_prompts, stream_fields

MAX_REQUESTS = 100_000
MAX_SECONDS = 3600.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tl-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (or .../v1)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host")
    p.add_argument("--model", default="", help="model id (default: the first of /v1/models)")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--concurrency", default="", help="closed loop levels, e.g. 1,4,16")
    loop.add_argument("--request-rate", default="", help="open loop levels (req/s), e.g. 2,8")
    p.add_argument("--max-concurrency", type=int, default=None, help="open loop: in-flight cap")
    p.add_argument("--num-requests", type=int, default=32, help="requests per level")
    p.add_argument("--input-len", default="128", help="prompt words (~tokens): N or LOW:HIGH")
    p.add_argument("--output-len", default="128", help="max_tokens: N or LOW:HIGH")
    p.add_argument(
        "--prompts-file", type=Path, help='JSONL of {"prompt": ...} or {"messages": ...}'
    )
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="one shared system prompt of ~N tokens + a unique --input-len question",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos: true")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into every body")
    p.add_argument("--max-seconds", type=float, default=300.0, help="hard cap per level")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="this run's name in plots (default: model@host)")
    p.add_argument("--out", type=Path, default=Path("bench/out/load.json"))
    p.add_argument("--plot", type=Path, default=None, help="PNG path (default: --out as .png)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.num_requests <= MAX_REQUESTS:
        p.error(f"--num-requests must be in 1..{MAX_REQUESTS}")
    if not 0 < args.max_seconds <= MAX_SECONDS:
        p.error(f"--max-seconds must be in (0, {MAX_SECONDS:g}]")
    if args.request_timeout <= 0 or (args.max_concurrency is not None and args.max_concurrency < 1):
        p.error("--request-timeout and --max-concurrency must be positive")
    return args


def levels(args: argparse.Namespace) -> list[tuple[int | None, float | None]]:
    """(concurrency, request_rate) per level; closed loop 1,4,16 when neither is given."""
    if args.request_rate:
        rates = [float(r) for r in args.request_rate.split(",")]
        if any(r <= 0 for r in rates):
            raise ValueError("--request-rate levels must be positive")
        return [(None, r) for r in rates]
    counts = [int(c) for c in (args.concurrency or "1,4,16").split(",")]
    if any(c < 1 for c in counts):
        raise ValueError("--concurrency levels must be >= 1")
    return [(c, None) for c in counts]


def api_root(base_url: str, allow_remote: bool) -> str:
    """The server root without a trailing /v1; refuses a non-loopback host unless allowed."""
    url = urlsplit(base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"--base-url {base_url!r}: need http://host:port")
    host = url.hostname
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost
        loopback = False
    if not (loopback or allow_remote):
        raise ValueError(f"refusing non-loopback host {host!r}; pass --allow-remote to load it")
    return base_url.rstrip("/").removesuffix("/v1")


async def first_model(root: str) -> str:
    """The first id of GET /v1/models."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(root + "/v1/models") as resp,
    ):
        resp.raise_for_status()
        doc = await resp.json()
    return str(doc["data"][0]["id"])


async def run(args: argparse.Namespace, root: str) -> RunReport:
    model = args.model or await first_model(root)
    extra = json.loads(args.extra_body)
    if not isinstance(extra, dict):
        raise ValueError("--extra-body must be a JSON object")
    workload = Workload(
        endpoint=args.endpoint,
        input_len=LengthDist.parse(args.input_len),
        output_len=LengthDist.parse(args.output_len),
        fields=stream_fields(model, args.temperature, not args.no_ignore_eos) | extra,
        shared_prefix_len=args.shared_prefix_len,
        file_prompts=read_prompts(args.prompts_file) if args.prompts_file else (),
    )
    print(HEADER, flush=True)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    reports: list[LevelReport] = []
    for i, (concurrency, rate) in enumerate(levels(args)):
        name = f"c={concurrency}" if concurrency is not None else f"rate={rate:g}/s"
        progress = Progress(name, args.num_requests)
        result = await run_level(
            root + workload.path,
            workload.bodies(args.num_requests, args.seed + i),
            concurrency=concurrency,
            request_rate=rate,
            max_concurrency=args.max_concurrency,
            max_seconds=args.max_seconds,
            timeout_s=args.request_timeout,
            seed=args.seed + i,
            progress=progress,
        )
        progress.close()
        report = summarize(
            result.records,
            concurrency=concurrency,
            request_rate=rate,
            num_requests=args.num_requests,
            duration_s=result.duration_s,
            hit_deadline=result.hit_deadline,
        )
        for record in result.records:
            if record.failure is not None and record.detail:
                print(f"  first failure ({record.failure}): {record.detail}", file=sys.stderr)
                break
        print(row(name, report), flush=True)
        reports.append(report)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return RunReport(
        label=args.label or f"{model}@{urlsplit(root).netloc}",
        base_url=root,
        model=model,
        endpoint=args.endpoint,
        started=started,
        settings=settings,
        levels=reports,
    )


HEADER = (
    f"{'level':>12} {'done':>5} {'fail':>5} {'req/s':>7} {'out tok/s':>9} "
    f"{'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'ITL p50':>8} {'p99':>8} {'e2e p50':>9}  (ms)"
)


def row(name: str, r: LevelReport) -> str:
    def ms(d: Dist | None, key: str) -> str:
        return "-" if d is None else f"{getattr(d, key):.1f}"

    return (
        f"{name:>12} {r.completed:>5} {r.failed:>5} {r.requests_per_s:>7.2f} "
        f"{r.output_tokens_per_s:>9.1f} {ms(r.ttft_ms, 'p50'):>9} {ms(r.ttft_ms, 'p99'):>8} "
        f"{ms(r.tpot_ms, 'p50'):>9} {ms(r.itl_ms, 'p50'):>8} {ms(r.itl_ms, 'p99'):>8} "
        f"{ms(r.e2e_ms, 'p50'):>9}" + (f"  failures {r.failures}" if r.failures else "")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        root = api_root(args.base_url, args.allow_remote)
        report = asyncio.run(run(args, root))
    except (ValueError, OSError, aiohttp.ClientError) as exc:
        print(f"tl-bench: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")
    print(f"wrote {args.out}")
    if not args.no_plot:
        png = args.plot or args.out.with_suffix(".png")
        try:
            from bench.plot import plot
        except ImportError as exc:  # matplotlib is optional: the `bench` extra
            print(f"no plot ({exc}); pip install -e '.[bench]'", file=sys.stderr)
        else:
            plot([report], png)
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

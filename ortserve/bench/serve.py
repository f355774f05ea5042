"""`ortserve bench serve`: drive an OpenAI-compatible /v1/completions endpoint and measure it.

Flow: build prompts (dataset.py) -> one untimed test request (a prompt of its own) -> optional warm-ups -> read the
server's counters -> send every prompt at its arrival time (arrivals.py), at most
--max-concurrency in flight -> read the counters again -> metrics.py -> report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from datetime import UTC, datetime
from pathlib import Path

from ortserve.bench import dataset, server_metrics
from ortserve.bench.arrivals import arrival_offsets
from ortserve.bench.metrics import RequestResult, calculate_metrics
from ortserve.bench.report import format_table, result_record, write_json
from ortserve.bench.request import BACKENDS, RequestSpec, send

HELP = "benchmark a running OpenAI-compatible server (metrics as `vllm bench serve`)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="openai",
        help="llama.cpp adds its own field names (n_predict, cache_prompt)",
    )
    p.add_argument("--model", default=None, help="model name sent in requests (default: first of /v1/models)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="local HF tokenizer dir, to build exact-length prompts and count output tokens "
        "(default: --model, when that is a directory)",
    )
    p.add_argument(
        "--dataset",
        choices=("random", "shared-prefix", "grounded"),
        default="random",
        help="grounded: copy or correct a given passage (chat-formatted; the model stops on its own)",
    )
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=96, help="shared-prefix: tokens every prompt shares")
    p.add_argument("--num-prefixes", type=int, default=1, help="shared-prefix: distinct prefixes, used in turn")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson; inf = all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument("--num-warmups", type=int, default=0, help="untimed requests after the test request")
    p.add_argument("--no-ignore-eos", action="store_true", help="let the model stop at EOS (lengths then vary)")
    p.add_argument("--percentiles", default="99", help="comma-separated, e.g. 50,90,99")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", default=None, help="write the full record here")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per request")


async def _first_model(client, base_url: str) -> str:
    async with client.get(f"{base_url}/v1/models", raise_for_status=True) as response:
        data = (await response.json()).get("data") or []
    if not data:
        raise SystemExit(f"{base_url}/v1/models lists no model: pass --model")
    return data[0]["id"]


def _requests(args, tokenizer) -> tuple[dataset.SampleRequest, list[dataset.SampleRequest]]:
    """A test prompt of its own (so it warms no cache the run could hit), then the run's prompts."""
    maker = dataset.PromptMaker(tokenizer)
    test = dataset.random_requests(maker, 1, args.input_len, args.output_len, seed=args.seed + 1_000_003)[0]
    if args.dataset == "random":
        return test, dataset.random_requests(maker, args.num_prompts, args.input_len, args.output_len, args.seed)
    if args.dataset == "grounded":
        return test, dataset.grounded_requests(tokenizer, args.num_prompts, args.input_len, args.output_len, args.seed)
    return test, dataset.shared_prefix_requests(
        maker, args.num_prompts, args.input_len, args.output_len, args.prefix_len, args.num_prefixes, args.seed
    )


async def _run_all(
    client,
    specs: list[RequestSpec],
    offsets: list[float],
    max_concurrency: int | None,
    count_tokens,
    disable_tqdm: bool,
) -> tuple[list[RequestResult], float]:
    from tqdm import tqdm

    gate = asyncio.Semaphore(max_concurrency or len(specs) or 1)
    bar = tqdm(total=len(specs), disable=disable_tqdm, unit="req")

    async def one(spec: RequestSpec, at: float, start: float) -> RequestResult:
        if (wait := start + at - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        async with gate:
            out = await send(client, spec, count_tokens)
        bar.update(1)
        return out

    start = time.perf_counter()
    outputs = await asyncio.gather(*(one(s, at, start) for s, at in zip(specs, offsets)))
    duration = time.perf_counter() - start
    bar.close()
    return list(outputs), duration


async def run_benchmark(args) -> dict:
    import aiohttp

    base_url = args.base_url.rstrip("/")
    tokenizer_dir = args.tokenizer or (args.model if args.model and Path(args.model).is_dir() else None)
    if tokenizer_dir is None:
        raise SystemExit("--tokenizer is required (a local HF tokenizer dir) unless --model is one")
    tokenizer = dataset.bench_tokenizer(tokenizer_dir)
    test_request, requests = _requests(args, tokenizer)
    count_tokens = tokenizer.count
    percentiles = [float(p) for p in args.percentiles.split(",") if p]

    timeout = aiohttp.ClientTimeout(total=args.timeout, sock_connect=30.0)
    connector = aiohttp.TCPConnector(limit=args.max_concurrency or 0, keepalive_timeout=60)  # 0: no cap
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as client,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as side,
    ):  # /metrics and /v1/models: off the request connections
        model = args.model or await _first_model(side, base_url)
        spec = lambda r: RequestSpec(
            url=base_url + args.endpoint,
            model=model,
            prompt=r.prompt,
            prompt_len=r.prompt_len,
            output_len=r.output_len,
            backend=args.backend,
            ignore_eos=not args.no_ignore_eos and args.dataset != "grounded",
        )
        test = await send(client, spec(test_request), count_tokens)
        if not test.success:
            raise SystemExit(f"test request to {base_url + args.endpoint} failed: {test.error}")
        if args.num_warmups:
            await _run_all(
                client,
                [spec(test_request)] * args.num_warmups,
                [0.0] * args.num_warmups,
                args.max_concurrency,
                count_tokens,
                True,
            )
        before = await server_metrics.settled_counters(side, base_url)
        offsets = arrival_offsets(len(requests), args.request_rate, args.burstiness, args.seed)
        outputs, duration = await _run_all(
            client, [spec(r) for r in requests], offsets, args.max_concurrency, count_tokens, args.disable_tqdm
        )
        after = await server_metrics.settled_counters(side, base_url)

    metrics = calculate_metrics(outputs, duration, percentiles)
    server_delta = server_metrics.delta(before, after)
    print(format_table(metrics, args.max_concurrency, args.request_rate, server_delta))
    for err in [o.error for o in outputs if not o.success][:5]:
        print(f"failed request: {err}")
    config = dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        backend=args.backend,
        base_url=base_url,
        endpoint=args.endpoint,
        model=model,
        tokenizer=str(tokenizer_dir),
        dataset=args.dataset,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        prefix_len=args.prefix_len if args.dataset == "shared-prefix" else None,
        num_prefixes=args.num_prefixes if args.dataset == "shared-prefix" else None,
        request_rate=args.request_rate if math.isfinite(args.request_rate) else "inf",
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
        ignore_eos=not args.no_ignore_eos and args.dataset != "grounded",
    )
    record = result_record(metrics, outputs, config, server_delta)
    if args.result_json:
        write_json(args.result_json, record)
    return record


def run(args) -> int:
    record = asyncio.run(run_benchmark(args))
    return 0 if record["failed"] == 0 else 1

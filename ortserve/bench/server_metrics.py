"""A server's Prometheus counters, read before and after a run so the bench can show the
server's own view of the same work (ortserve:prompt_tokens_total, vllm:generation_tokens_total...)."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def parse_counters(text: str) -> dict[str, float]:
    """Sum every `*_total` sample by metric name, over all label sets (prometheus_client's parser)."""
    totals: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:  # not the Prometheus text format
        return totals
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def fetch_counters(client: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
    """The counters at base_url/metrics, or None when the server has no such endpoint."""
    try:
        async with client.get(f"{base_url.rstrip('/')}/metrics", timeout=aiohttp.ClientTimeout(total=10.0)) as response:
            if response.status != 200:
                return None
            return parse_counters(await response.text())
    except (aiohttp.ClientError, TimeoutError):
        return None


async def settled_counters(
    client: aiohttp.ClientSession, base_url: str, wait: float = 0.5, limit: float = 10.0
) -> dict[str, float] | None:
    """The counters once two reads `wait` seconds apart agree: a server may publish its last
    step's statistics a moment after the last response ends."""
    current = await fetch_counters(client, base_url)
    for _ in range(int(limit / wait)):
        if current is None:
            return None
        await asyncio.sleep(wait)
        latest = await fetch_counters(client, base_url)
        if latest == current:
            return latest
        current = latest
    return current


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items()) if v - before.get(k, 0.0) != 0}

"""``ortserve serve-cluster`` on a local Ray cluster: 2 engine replicas of 1 core each on the tiny
Llama artifact, behind one ingress.

- Prefix affinity: a workload of requests that share system prompts gets a higher prefix-cache
  hit rate, read from each replica's own /metrics, than the same workload routed round robin.
- Greedy output through the cluster is the single server's, streamed or not.
- Killing one replica's process loses no request that had not started: requests sent after the
  kill are all answered, and Ray brings the replica back.

Short form in CI (one round of each); ``--ray-long`` runs more groups, questions and kills.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from cluster_process import REPLICA_FLAGS, SERVED_NAME, Cluster, stop_cluster
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess

pytestmark = pytest.mark.ray


def system_prompt(group: int) -> str:
    return f"You are assistant {group} of the cluster test. " + f"Follow rule {group}: be brief and exact. " * 14


def chat(url: str, messages: list[dict], **params) -> httpx.Response:
    body = {"model": SERVED_NAME, "temperature": 0, "max_tokens": 2, "messages": messages, **params}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def run_workload(cluster: Cluster, groups: int, questions: int) -> dict[int, list[str]]:
    """Sequential chats, the groups interleaved (g0 g1 g2 g0 ...); which replica served each."""
    served: dict[int, list[str]] = defaultdict(list)
    for question in range(questions):
        for group in range(groups):
            messages = [
                {"role": "system", "content": system_prompt(group)},
                {"role": "user", "content": f"Question {question}: what do you do?"},
            ]
            reply = chat(cluster.url, messages)
            assert reply.status_code == 200, reply.text
            served[group].append(reply.headers["x-ortserve-replica"])
    return served


def prefix_cache(cluster: Cluster) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over each replica's own /metrics."""
    hits = queries = 0.0
    for replica in cluster.replicas():
        text = httpx.get(f"{replica['url']}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "ortserve:prefix_cache_hits_total":
                    hits += sample.value
                elif sample.name == "ortserve:prefix_cache_queries_total":
                    queries += sample.value
    return hits, queries


def test_prefix_affinity_beats_round_robin_in_prefix_cache_hits(start_cluster, ray_long, report_figure, request):
    groups, questions = (7, 8) if ray_long else (3, 4)  # an odd count: round robin alternates each group
    rates, misses = {}, {}
    for router in ("round-robin", "prefix"):
        cluster = start_cluster(router) if router == "round-robin" else request.getfixturevalue("prefix_cluster")
        before_hits, before_queries = prefix_cache(cluster)
        served = run_workload(cluster, groups, questions)
        hits, queries = prefix_cache(cluster)
        rates[router] = (hits - before_hits) / (queries - before_queries)
        misses[router] = (queries - before_queries) - (hits - before_hits)  # prompt tokens prefilled
        if router == "round-robin":
            assert all(len(set(replicas)) == 2 for replicas in served.values()), served  # each group on both
            stop_cluster(cluster)
        else:
            assert all(len(set(replicas)) == 1 for replicas in served.values()), served  # each group stays put
    report_figure(
        f"prefix-cache hit rate over {groups} groups x {questions} questions, 2 replicas: "
        f"prefix affinity {rates['prefix']:.2f}, round robin {rates['round-robin']:.2f}; prompt tokens prefilled "
        f"{misses['prefix']:.0f} and {misses['round-robin']:.0f}"
    )
    # Round robin prefills each shared prompt once per replica, prefix affinity once: expect about
    # half the misses (the questions themselves always miss).
    assert rates["prefix"] > rates["round-robin"]
    assert misses["prefix"] < 0.8 * misses["round-robin"], misses


@pytest.fixture(scope="module")
def prefix_cluster(start_cluster) -> Cluster:
    return start_cluster("prefix")


@pytest.fixture(scope="module")
def single_server(tiny_llama_artifact: Path):
    """The same artifact and engine flags in one `ortserve serve`, on one core like a replica."""
    server = ServerProcess.real(tiny_llama_artifact, *REPLICA_FLAGS, "--threads-bind", "0")
    try:
        server.wait_ready(300)
        yield server
    finally:
        server.stop(60)


def stream_text(url: str, body: dict) -> tuple[str, str | None]:
    text, finish = [], None
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
    return "".join(text), finish


def test_greedy_output_is_the_single_servers(prefix_cluster, single_server, ray_long):
    prompts = [f"Tell me about topic {i} in detail." for i in range(8 if ray_long else 3)]
    seen = set()
    for prompt in prompts:
        chat_body = {
            "model": SERVED_NAME,
            "temperature": 0,
            "max_tokens": 24,
            "messages": [{"role": "user", "content": prompt}],
        }
        completion_body = {"model": SERVED_NAME, "temperature": 0, "max_tokens": 24, "prompt": prompt}
        for path, body in (("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)):
            ours = httpx.post(f"{prefix_cluster.url}{path}", json=body, timeout=120)
            theirs = httpx.post(f"{single_server.base_url}{path}", json=body, timeout=120)
            assert ours.status_code == theirs.status_code == 200, ours.text
            seen.add(ours.headers["x-ortserve-replica"])
            mine, reference = ours.json()["choices"][0], theirs.json()["choices"][0]
            assert mine.get("message", mine.get("text")) == reference.get("message", reference.get("text"))
            assert mine["finish_reason"] == reference["finish_reason"]
            assert ours.json()["usage"]["completion_tokens"] == theirs.json()["usage"]["completion_tokens"]
            streamed = stream_text(f"{prefix_cluster.url}{path}", body)
            assert streamed == stream_text(f"{single_server.base_url}{path}", body)
    bad = httpx.post(f"{prefix_cluster.url}/v1/chat/completions", json={"model": SERVED_NAME, "messages": []})
    reference = httpx.post(f"{single_server.base_url}/v1/chat/completions", json={"model": SERVED_NAME, "messages": []})
    assert bad.status_code == reference.status_code == 400 and bad.json() == reference.json()


async def stream_chat(url: str, prompt: str, max_tokens: int, seen: dict | None = None) -> dict:
    """A streamed chat; what the client saw: status, replica, tokens, finish reason, error event.
    ``seen`` fills as it goes: ``seen["started"]`` is set with the first event."""
    body = {
        "model": SERVED_NAME,
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }
    seen = seen if seen is not None else {}
    seen.update(status=None, replica=None, chunks=0, finish=None, error=None, done=False, started=asyncio.Event())
    async with (
        httpx.AsyncClient(timeout=180) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
    ):
        seen["status"], seen["replica"] = response.status_code, response.headers.get("x-ortserve-replica")
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                seen["done"] = True
            elif line.startswith("data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    seen["error"] = event["error"]["message"]
                    continue
                seen["chunks"] += 1
                seen["finish"] = event["choices"][0]["finish_reason"] or seen["finish"]
                seen["started"].set()
    return seen


# The fresh requests share this prefix with the victim's seed request, so prefix affinity sends them
# to the victim: it is the replica that must not take them down with it.
SEED = "Seed story: the replica that holds this prefix is the one that will be killed. " * 3


async def some_waiting(replica_url: str) -> None:
    """Until the replica's engine reports a request waiting (its own /metrics): one routed to it
    that has not started."""
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            text = (await client.get(f"{replica_url}/metrics")).text
            gauge = re.search(r"^ortserve:num_requests_waiting\{[^}]*\} (\S+)$", text, re.MULTILINE)
            if gauge and float(gauge.group(1)) >= 1:
                return
            await asyncio.sleep(0.02)


async def kill_one_replica(cluster: Cluster, busy: bool) -> tuple[dict, list[dict], list[dict]]:
    """SIGKILL the replica holding SEED, and see what the clients saw: (victim, long, fresh).

    Busy: 4 long streams (one of them SEED's) fill both engines (2 sequences each) and produce
    tokens; 8 fresh requests with SEED's prefix are routed to the victim, and once its engine
    reports one of them waiting (not started), the kill (on a fast machine a long stream may end
    first and let some fresh ones start on the victim: those may fail, having started). Idle: a
    short SEED request picks the victim, the kill, then the fresh
    requests, while the router may still believe the victim alive."""
    long_seen: list[dict] = [{} for _ in range(4 if busy else 0)]
    prompts = [SEED + "Part one.", *(f"Long story number {i}" for i in range(1, len(long_seen)))]
    long = [  # 1,900 tokens: max_model_len is 2048
        asyncio.create_task(stream_chat(cluster.url, prompt, 1900, seen)) for prompt, seen in zip(prompts, long_seen)
    ]
    if busy:
        await asyncio.sleep(0.5)  # the tasks have filled in their `started` events
        await asyncio.wait_for(asyncio.gather(*(s["started"].wait() for s in long_seen)), 120)
        victim_id = long_seen[0]["replica"]
    else:
        victim_id = (await stream_chat(cluster.url, SEED + "Warm-up.", 4))["replica"]
    victim = next(r for r in cluster.replicas() if r["replica_id"] == victim_id)
    fresh_seen: list[dict] = [{} for _ in range(8)]
    fresh: list[asyncio.Task] = []
    if busy:
        fresh = [
            asyncio.create_task(stream_chat(cluster.url, SEED + f"Fresh question {i}.", 16, seen))
            for i, seen in enumerate(fresh_seen)
        ]
        await asyncio.wait_for(some_waiting(victim["url"]), 60)  # routed to the victim, not started
    os.kill(victim["pid"], signal.SIGKILL)
    if not busy:
        fresh = [
            asyncio.create_task(stream_chat(cluster.url, SEED + f"Fresh question {i}.", 16, seen))
            for i, seen in enumerate(fresh_seen)
        ]
    return victim, list(await asyncio.gather(*long)), list(await asyncio.gather(*fresh))


def test_killing_a_replica_loses_no_request_that_had_not_started(prefix_cluster, ray_long, report_figure):
    for round_ in range(6 if ray_long else 2):
        busy = round_ % 2 == 0
        prefix_cluster.wait_replicas(2)
        victim, long, fresh = asyncio.run(kill_one_replica(prefix_cluster, busy))
        # A stream opens with its first token, so the replica header says where a request started: none
        # that had not started on the victim may be lost, and those that had end finished or with an error.
        moved = [o for o in fresh if o["replica"] != victim["replica_id"]]
        for outcome in moved:
            assert outcome["status"] == 200 and outcome["error"] is None, outcome
            assert outcome["finish"] == "length" and outcome["chunks"] >= 16 and outcome["done"], outcome
        for outcome in fresh:
            if outcome["replica"] == victim["replica_id"]:
                assert outcome["done"] and (outcome["error"] is not None or outcome["finish"] == "length"), outcome
        assert moved, "no request was waiting on the killed replica"  # the case this test is about
        for outcome in long:  # had started: on the victim they end with an error event (or finished first)
            if outcome["replica"] == victim["replica_id"]:
                assert outcome["done"] and (outcome["error"] is not None or outcome["finish"] == "length"), outcome
            else:
                assert outcome["error"] is None and outcome["finish"] == "length", outcome
        cut = sum(o["replica"] == victim["replica_id"] and o["error"] is not None for o in long)
        started = time.monotonic()
        back = prefix_cluster.wait_replicas(2, timeout=180, exclude={victim["replica_id"]})
        assert victim["replica_id"] not in {r["replica_id"] for r in back}
        report_figure(
            f"kill round {round_ + 1} ({'busy' if busy else 'idle'} replica): {len(moved)} of {len(fresh)} requests "
            f"with the killed replica's prefix not started at the kill, all answered by the other; {cut} of "
            f"{len(long)} started streams were cut on the killed replica; a new replica reported in after "
            f"{time.monotonic() - started:.0f} s"
        )
        reply = chat(prefix_cluster.url, [{"role": "user", "content": "still there?"}])
        assert reply.status_code == 200

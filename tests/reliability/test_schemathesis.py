"""schemathesis against the server's own OpenAPI schema: no server error for any generated case,
and every case that breaks the schema is rejected with a 4xx. Valid-per-schema cases that are
refused may only be refused for a limit that depends on the loaded model (vocabulary, context
length), which a static schema cannot state; each refusal's message is checked for that."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.reliability
MODEL_LIMITS = ("outside the vocabulary", "maximum context length", "is empty")


def test_schemathesis_finds_no_server_error_and_no_unexplained_rejection(start_fake, tmp_path, tally, long_run):
    proc = start_fake("--max-num-seqs", "8", "--step-seconds", "0.001", "--max-waiting-requests", "100000")
    report = tmp_path / "events.ndjson"
    result = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{proc.base_url}/schema/openapi.json",
         "--checks", "not_a_server_error,negative_data_rejection,positive_data_acceptance",
         "--max-examples", "150" if long_run else "25", "--seed", "1", "--request-timeout", "60",
         "--report", "ndjson", "--report-ndjson-path", str(report), "--continue-on-failure", "--no-color"],
        capture_output=True, text=True, timeout=3000, check=False)
    failures: dict[str, list[str]] = {}
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for check in _checks(event):
            if check.get("status") == "failure":
                failures.setdefault(check["name"], []).append(json.dumps(check)[:2000])
    cases = result.stdout.count("\n")
    tally.rows.append(("schemathesis", f"exit {result.returncode}; failures by check: "
                                       f"{ {k: len(v) for k, v in failures.items()} }"))
    assert "not_a_server_error" not in failures, failures["not_a_server_error"][:3]
    assert "negative_data_rejection" not in failures, failures["negative_data_rejection"][:3]
    unexplained = [f for f in failures.get("positive_data_acceptance", [])
                   if not any(limit in f for limit in MODEL_LIMITS)]
    assert not unexplained, unexplained[:3]
    assert cases > 0, result.stdout[-3000:]


def _checks(node):
    """Every check result in a schemathesis ndjson event, wherever it nests."""
    if isinstance(node, dict):
        if "name" in node and "status" in node and isinstance(node.get("name"), str):
            yield node
        for value in node.values():
            yield from _checks(value)
    elif isinstance(node, list):
        for value in node:
            yield from _checks(value)

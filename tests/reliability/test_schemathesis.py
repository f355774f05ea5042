"""schemathesis against the server's own OpenAPI schema: no server error for any generated case,
and every case that breaks the schema is rejected with a 4xx. Valid-per-schema cases that are
refused may only be refused for a limit that depends on the loaded model (vocabulary, context
length), which a static schema cannot state; each refusal's message is checked for that."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.reliability
# Limits a static schema cannot state: the loaded model's, a rule about the last message, whether
# llguidance compiles a grammar, rules that compare values (a named tool among the tools, tool
# names unique, best_of >= n), and cross-field rules the schema leaves out because with them it no
# longer canonicalises (only one field may constrain the output; a forced tool choice needs tools).
MODEL_LIMITS = (
    "outside the vocabulary",
    "maximum context length",
    "is empty",
    "needs the last message to be",
    "the grammar compiler rejected it",
    "is not among the tools",
    "two functions of the same name",
    "must be at least 'n'",
    "give only one of them",
    "forces a call, so",
    "needs 'tools' (or 'functions') to choose from",
)


def test_schemathesis_finds_no_server_error_and_no_unexplained_rejection(start_fake, tmp_path, tally, long_run):
    proc = start_fake(
        "--max-num-seqs",
        "8",
        "--step-seconds",
        "0.001",
        "--max-waiting-requests",
        "100000",
        "--max-request-body-bytes",
        str(64 << 20),
    )
    report = tmp_path / "events.ndjson"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{proc.base_url}/schema/openapi.json",
            "--checks",
            "not_a_server_error,negative_data_rejection,positive_data_acceptance",
            "--max-examples",
            "150" if long_run else "25",
            "--seed",
            "1",
            "--request-timeout",
            "60",
            "--report",
            "ndjson",
            "--report-ndjson-path",
            str(report),
            "--continue-on-failure",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    failures = failed_checks(report)
    refused = failures.get("positive_data_acceptance", [])
    by_limit = {limit: n for limit in MODEL_LIMITS if (n := sum(limit in body for body in refused))}
    tally.rows.append(
        ("schemathesis", f"exit {result.returncode}; failures by check: { {k: len(v) for k, v in failures.items()} }")
    )
    tally.rows.append(("schemathesis: valid-per-schema cases refused for a model limit", str(by_limit)))
    assert "not_a_server_error" not in failures, failures["not_a_server_error"][:3]
    assert "negative_data_rejection" not in failures, failures["negative_data_rejection"][:3]
    unexplained = [body for body in refused if not any(limit in body for limit in MODEL_LIMITS)]
    assert not unexplained, unexplained[:3]
    assert "test cases" in result.stdout.lower() or "generated" in result.stdout, result.stdout[-3000:]


def failed_checks(report) -> dict[str, list[str]]:
    """check name -> the response bodies of the cases that failed it (from the ndjson report)."""
    failures: dict[str, list[str]] = {}
    for line in report.read_text().splitlines():
        recorder = json.loads(line).get("ScenarioFinished", {}).get("recorder", {})
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check.get("status") != "failure":
                    continue
                response = recorder.get("interactions", {}).get(case_id, {}).get("response") or {}
                content = response.get("content") or {}
                body = (
                    base64.b64decode(content["$base64"]).decode(errors="replace")
                    if "$base64" in content
                    else json.dumps(content)
                )
                failures.setdefault(check["name"], []).append(f"{response.get('status_code')} {body[:1000]}")
    return failures

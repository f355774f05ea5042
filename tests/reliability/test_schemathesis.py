"""schemathesis against the server's own OpenAPI schema: no server error for any generated case,
every case that breaks the schema is rejected with a 4xx, every case valid per the schema is
accepted, and the schema stays one that schemathesis can generate from (a schema error would
silently test nothing). schemathesis_hooks.py gives the generator the formats of grammar texts and
chat's cross-field rules (see there why).

The loaded model's limits are in the schema (token ids below its vocabulary). Its context length
depends on how text tokenizes, so no schema can state it: the server under test has a context that
no body it accepts can fill (a byte of body is at most one token of prompt, a template adds a few
per message: 2**30 tokens against 64 MiB of body); the 400 for a prompt longer than the context is
tests/server's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability
BODY_BYTES = 64 << 20
CONTEXT_TOKENS = 1 << 30


def test_schemathesis_finds_no_server_error_and_no_unexplained_rejection(start_fake, tmp_path, tally, long_run):
    proc = start_fake(
        "--max-num-seqs",
        "8",
        "--step-seconds",
        "0.001",
        "--max-waiting-requests",
        "100000",
        "--max-request-body-bytes",
        str(BODY_BYTES),
        "--max-model-len",
        str(CONTEXT_TOKENS),
        "--max-generated",
        "16",
    )
    report = tmp_path / "events.ndjson"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(Path(__file__).parent / "schemathesis.toml"),
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
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        },
    )
    failures = failed_checks(report)
    refused = failures.get("positive_data_acceptance", [])
    tally.rows.append(
        ("schemathesis", f"exit {result.returncode}; failures by check: { {k: len(v) for k, v in failures.items()} }")
    )
    tally.rows.append(("schemathesis: valid-per-schema cases refused", str(len(refused))))
    assert "Schema Error" not in result.stdout, result.stdout[-3000:]
    assert "not_a_server_error" not in failures, failures["not_a_server_error"][:3]
    assert "negative_data_rejection" not in failures, failures["negative_data_rejection"][:3]
    assert not refused, refused[:3]
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
                request = recorder.get("interactions", {}).get(case_id, {}).get("request") or {}
                sent = f"{request.get('uri')} {str(request.get('body'))[:1500]}"  # base64 when not text
                failures.setdefault(check["name"], []).append(f"{response.get('status_code')} {body[:1000]} <- {sent}")
    return failures

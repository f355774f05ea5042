"""benchmarks/compare.py remembers the runs behind its records (run.json), and RESULTS.md names
them: a full --force run starts the list afresh, a partial run is appended to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare
import report
import run_coverage


def test_runs_are_listed_in_order_and_a_full_forced_run_starts_afresh(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "RECORDS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["compare.py", "--force"])
    compare.write_run("t0", [], forced_all=True)
    monkeypatch.setattr(sys, "argv", ["compare.py", "--force", "--models", "smollm2-135m"])
    compare.write_run(
        "t1", ["smollm2-135m / llama.cpp int4: boom"], forced_all=False, stopped="stopped in round 2 of 3"
    )
    runs = json.loads((tmp_path / "run.json").read_text())
    assert [r["command"] for r in runs] == [
        "python benchmarks/compare.py --force",
        "python benchmarks/compare.py --force --models smollm2-135m",
    ]
    assert runs[1]["failures"] == ["smollm2-135m / llama.cpp int4: boom"]
    assert "stopped" not in runs[0] and runs[1]["stopped"] == "stopped in round 2 of 3"

    results = tmp_path / "RESULTS.md"
    report.write(results, [report.IsaRun("AVX2", [], {"membw": {}, "versions": {}}, runs)])
    text = results.read_text()
    assert "1. `python benchmarks/compare.py --force` (t0 to " in text
    assert "2. `python benchmarks/compare.py --force --models smollm2-135m` (t1 to " in text
    assert ", stopped in round 2 of 3); failed parts" in text
    assert "failed parts: smollm2-135m / llama.cpp int4: boom" in text

    monkeypatch.setattr(sys, "argv", ["compare.py", "--force", "--repeat", "2"])
    compare.write_run("t2", [], forced_all=True)
    assert [r["started"] for r in json.loads((tmp_path / "run.json").read_text())] == ["t2"]


def test_coverage_says_when_one_run_measured_every_row():
    runs = [
        {
            "command": "python benchmarks/compare.py --repeat 3",
            "started": "2026-11-26T10:00:00+0000",
            "finished": "2026-11-26T11:00:00+0000",
            "failures": [],
        },
        {
            "command": "python benchmarks/compare.py --force --models smollm2-135m",
            "started": "2026-11-26T12:00:00+0000",
            "finished": "2026-11-26T13:00:00+0000",
            "failures": [],
        },
    ]
    row = {"model": "smollm2-135m", "system": "ortserve", "precision": "int4", "workload": "decode"}
    later = [
        {**row, "when": "2026-11-26T12:30:00+00:00"},
        {**row, "workload": "prefill", "when": "2026-11-26T12:40:00+00:00"},
    ]
    text = run_coverage.coverage(later, runs)
    assert text.startswith(
        "**One run, part of the comparison.** Every row below is from "
        "`python benchmarks/compare.py --force --models smollm2-135m`"
    )
    mixed = [later[0], {**later[1], "when": "2026-11-26T10:30:00+00:00"}]
    assert run_coverage.coverage(mixed, runs).startswith(
        "**2 runs, part of the comparison.** A later run replaced the rows it re-measured: "
        "`python benchmarks/compare.py --repeat 3` (2026-11-26T10:00:00+0000 to 2026-11-26T11:00:00+0000): 1 rows; "
        "`python benchmarks/compare.py --force --models smollm2-135m` (2026-11-26T12:00:00+0000 to "
        "2026-11-26T13:00:00+0000): 1 rows."
    )
    outside = [later[0], {**later[1], "when": "2026-11-26T11:30:00+00:00"}]  # between the runs
    partial = "**Partial run.** Rows below were measured at different times"
    assert run_coverage.coverage(outside, runs).startswith(partial)


def test_a_target_whose_systems_come_from_two_runs_says_so():
    import targets

    def rec(system: str, tok_s: float, when: str) -> dict:
        metrics = {"decode_tok_s": tok_s}
        return {
            "model": "m",
            "system": system,
            "precision": "int4",
            "workload": "decode",
            "metrics": metrics,
            "when": when,
        }

    runs = [
        {"command": "a", "started": f"2026-11-26T{h}:00:00+00:00", "finished": f"2026-11-26T{h + 1}:00:00+00:00"}
        for h in (10, 12)
    ]
    records = [
        rec("ortserve", 150.0, "2026-11-26T12:10:00+00:00"),
        rec("llama.cpp", 75.0, "2026-11-26T12:20:00+00:00"),
        rec("ortserve-a8", 160.0, "2026-11-26T10:30:00+00:00"),
    ]
    table = targets.targets(records, None, lambda *a: None, lambda r: run_coverage.run_of(r, runs))
    assert "| decode vs llama.cpp, int4 | 2.00 | ≥ 1.1 | yes |" in table
    assert "| decode vs llama.cpp, int4 (ortserve-a8: int8 activations) (two runs) | 2.13 | ≥ 1.1 | yes |" in table


def test_decode_roofline_takes_the_larger_bandwidth_of_before_and_after_the_run(tmp_path, monkeypatch):
    from runners import common

    monkeypatch.setattr(common, "RECORDS", tmp_path)
    monkeypatch.setattr(common, "read_bandwidth", lambda: 20.0)  # "after": the neighbours got busy
    monkeypatch.setattr(report, "weight_bytes", lambda *args: 1_000_000_000)
    decode = common.WORKLOADS["decode"]
    metrics = common.serve_metrics(_bench(bandwidth_before_GBps=30.0), decode)
    rec = common.record("smollm2-135m", "ortserve", "fp32", decode, metrics, "cmd")
    m = rec["metrics"]
    assert (m["bandwidth_before_GBps"], m["bandwidth_after_GBps"], m["bandwidth_GBps"]) == (30.0, 20.0, 30.0)
    row = report.decode_table([rec], None)[2]
    # 25 tok/s x 1 GB against 30 GB/s: 83 %, not the 125 % that the bandwidth after the run would give
    assert "| 30.0 (30.0 / 20.0) | 30.0 | 83% |" in row


def _bench(**extra) -> dict:
    """An `ortserve bench serve` record of the decode workload: 40 ms per output token."""
    bench = dict(completed=3, failed=0, output_throughput=24.0, total_token_throughput=48.0)
    bench.update(median_ttft_ms=200.0, p99_ttft_ms=210.0, median_tpot_ms=40.0, median_itl_ms=40.0)
    bench.update(median_e2el_ms=5000.0, input_lens=[128] * 3, output_lens=[128] * 3)
    return {**bench, **extra}


def test_a_decode_faster_than_the_measured_roofline_is_not_counted_as_met():
    import targets

    def fp32_decode(tok_s: float) -> dict:
        metrics = {"decode_tok_s": tok_s, "bandwidth_GBps": 20.0}
        return {"model": "m", "system": "ortserve", "precision": "fp32", "workload": "decode", "metrics": metrics}

    one_gb = lambda *a: 1_000_000_000  # 20 GB/s over 1 GB a token: a roofline of 20 tok/s
    assert "| fp32 decode / roofline | 0.90 | ≥ 0.85 | yes |" in targets.targets([fp32_decode(18.0)], None, one_gb)
    table = targets.targets([fp32_decode(22.0)], None, one_gb)
    assert "| fp32 decode / roofline | 1.10 | ≥ 0.85 | unclear: above 1, the bandwidth moved" in "\n".join(table)


def test_a_miss_that_two_decimals_would_round_up_to_the_goal_shows_three():
    import targets

    metrics = {"decode_tok_s": 16.92, "bandwidth_GBps": 20.0}  # 0.846 of a 20 tok/s roofline
    record = {"model": "m", "system": "ortserve", "precision": "fp32", "workload": "decode", "metrics": metrics}
    table = targets.targets([record], None, lambda *a: 1_000_000_000)
    assert "| fp32 decode / roofline | 0.846 | ≥ 0.85 | **no** |" in table

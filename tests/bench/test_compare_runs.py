"""benchmarks/compare.py remembers the runs behind its records (run.json), and RESULTS.md names
them: a full --force run starts the list afresh, a partial run is appended to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare
import report


def test_runs_are_listed_in_order_and_a_full_forced_run_starts_afresh(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "RECORDS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["compare.py", "--force"])
    compare.write_run("t0", [], forced_all=True)
    monkeypatch.setattr(sys, "argv", ["compare.py", "--force", "--models", "smollm2-135m"])
    compare.write_run("t1", ["smollm2-135m / llama.cpp int4: boom"], forced_all=False)
    runs = json.loads((tmp_path / "run.json").read_text())
    assert [r["command"] for r in runs] == [
        "python benchmarks/compare.py --force",
        "python benchmarks/compare.py --force --models smollm2-135m",
    ]
    assert runs[1]["failures"] == ["smollm2-135m / llama.cpp int4: boom"]

    results = tmp_path / "RESULTS.md"
    report.write(results, [report.IsaRun("AVX2", [], {"membw": {}, "versions": {}}, runs)])
    text = results.read_text()
    assert "1. `python benchmarks/compare.py --force`, t0 to " in text
    assert "2. `python benchmarks/compare.py --force --models smollm2-135m`, t1 to " in text
    assert "failed parts: smollm2-135m / llama.cpp int4: boom" in text

    monkeypatch.setattr(sys, "argv", ["compare.py", "--force", "--repeat", "2"])
    compare.write_run("t2", [], forced_all=True)
    assert [r["started"] for r in json.loads((tmp_path / "run.json").read_text())] == ["t2"]
